"""A shell loop that counts into a file every 0.1 s: a process whose state a pause, a fork or
a move must keep. Each value is written to a temporary file and renamed into place, so a
reader never sees the file empty (``echo > file`` truncates it first)."""

from __future__ import annotations


def counting_into(path: str) -> str:
    """The loop, for ``sh -c``."""
    return (f"i=0; while :; do i=$((i+1)); echo $i > {path}.new; mv {path}.new {path}; "
            "sleep 0.1; done")


#: Started in the background by ``commands.run``, counting into /tmp/count.
COUNT = f"nohup sh -c '{counting_into('/tmp/count')}' >/dev/null 2>&1 &"
