"""The start command's output copied to envd's own stdout — the sandbox's console, which
the node reads into the sandbox's logs (``orchestrator/sandbox_logs.py``, docs/logs.md), as
E2B shows a start command's output there.

Which process: the one started with the tag :data:`START_TAG` (the node tags the template's
start command so). Each line is written whole, as ``[start stdout] <line>`` or ``[start
stderr] <line>``, one ``write`` per line (so lines of envd's own never cut into it); a line
longer than :data:`MAX_LINE` is cut; at most :data:`MAX_BYTES` in all — a chatty server
started by a template would otherwise grow the console file without end — past which one
line says the rest is not copied. The output still reaches the process's subscribers as
before; the copy never fails the process (a write that fails is dropped).
"""

from __future__ import annotations

import contextlib
import os

START_TAG = "aenv-start-command"
#: How a copied line begins on the console, before its stream's name.
PREFIX = "[start "
MAX_LINE = 4096
MAX_BYTES = 4 << 20


class ConsoleTee:
    def __init__(self, fd: int = 1, limit: int = MAX_BYTES) -> None:
        self.fd = fd
        self.limit = limit
        self.written = 0
        self._partial: dict[str, bytes] = {}
        self._full = False

    def write(self, stream: str, data: bytes) -> None:
        if self._full:
            return
        *lines, rest = (self._partial.get(stream, b"") + data).split(b"\n")
        if len(rest) > MAX_LINE:  # a line that never ends: out now, cut
            lines.append(rest)
            rest = b""
        self._partial[stream] = rest
        for line in lines:
            self._emit(stream, line)

    def close(self) -> None:
        """The process ended: its last unended lines out."""
        for stream, rest in self._partial.items():
            if rest:
                self._emit(stream, rest)
        self._partial.clear()

    def _emit(self, stream: str, line: bytes) -> None:
        if self._full:
            return
        cut = line[:MAX_LINE] + (b"..." if len(line) > MAX_LINE else b"")
        out = f"{PREFIX}{stream}] ".encode() + cut.rstrip(b"\r") + b"\n"
        if self.written + len(out) > self.limit:
            self._full = True
            out = (f"{PREFIX}{stream}] (the start command's output past "
                   f"{self.limit} bytes is not copied to the logs)\n").encode()
        self.written += len(out)
        with contextlib.suppress(OSError):
            os.write(self.fd, out)
