"""inotify-backed watchers (to be completed)."""

from __future__ import annotations


class WatcherRegistry:
    def close_all(self) -> None:
        pass
