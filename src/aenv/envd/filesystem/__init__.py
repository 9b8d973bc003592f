"""``filesystem.Filesystem``: entries, directory operations and inotify watchers."""
