"""The local terminal of an interactive session: raw mode, its size, the detach key.

Owns the terminal's mode for the length of a session and nothing else: :func:`raw` saves the
termios attributes before switching to raw mode and restores them on every way out (the shell
ended, a detach, an error, Ctrl-C never reaches us in raw mode: it goes to the sandbox as 0x03).
"""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Iterator

from e2b import PtySize

#: Ctrl-], telnet's escape: a byte no shell or editor binds by default, one key in tmux.
DETACH_KEY = b"\x1d"
DETACH_NAME = "Ctrl-]"


@contextlib.contextmanager
def raw(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode (every key as it is typed, no local echo) meanwhile."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def size(fd: int) -> PtySize:
    """The terminal's size, as envd's PTY wants it (80x24 when it cannot be read)."""
    try:
        columns, lines = os.get_terminal_size(fd)
    except OSError:
        columns, lines = 80, 24
    return PtySize(rows=lines or 24, cols=columns or 80)


def split_detach(data: bytes) -> tuple[bytes, bool]:
    """What of ``data`` goes to the sandbox, and whether the detach key came in it (what
    was typed after the key is dropped: the session is over)."""
    at = data.find(DETACH_KEY)
    if at < 0:
        return data, False
    return data[:at], True
