"""Exit codes and status strings, spelled the way E2B's (Go) envd reports them."""

from __future__ import annotations

import signal
from dataclasses import dataclass

_GO_SIGNAL_NAMES = {
    signal.SIGHUP: "hangup",
    signal.SIGINT: "interrupt",
    signal.SIGQUIT: "quit",
    signal.SIGILL: "illegal instruction",
    signal.SIGTRAP: "trace/breakpoint trap",
    signal.SIGABRT: "aborted",
    signal.SIGBUS: "bus error",
    signal.SIGFPE: "floating point exception",
    signal.SIGKILL: "killed",
    signal.SIGUSR1: "user defined signal 1",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGUSR2: "user defined signal 2",
    signal.SIGPIPE: "broken pipe",
    signal.SIGALRM: "alarm clock",
    signal.SIGTERM: "terminated",
}


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int
    exited: bool
    status: str
    error: str | None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitInfo:
        """``returncode`` as from ``Popen``: negative means killed by that signal."""
        if returncode >= 0:
            status = f"exit status {returncode}"
            return cls(returncode, True, status, status if returncode else None)
        signum = -returncode
        try:
            name = _GO_SIGNAL_NAMES.get(signal.Signals(signum), f"signal {signum}")
        except ValueError:
            name = f"signal {signum}"
        status = f"signal: {name}"
        return cls(-1, False, status, status)

    @classmethod
    def failed_to_start(cls, message: str) -> ExitInfo:
        return cls(-1, False, "failed to start", message)
