"""``runtime.exits.reason``: the cause of a runtime's end, most specific first."""

from __future__ import annotations

import signal
from pathlib import Path

from aenv.runtime import exits

#: No such cgroup: no OOM kills counted.
NO_CGROUP = "aenv-unit-test/none"


def test_a_signal_is_a_kill_and_an_exit_status_an_exit(tmp_path: Path) -> None:
    killed = exits.reason(signal.SIGKILL, cgroup=NO_CGROUP, logs=[])
    assert (killed.cause, killed.message) == (
        "killed",
        "the sandbox's runtime was killed by SIGKILL",
    )
    exited = exits.reason(3 << 8, cgroup=NO_CGROUP, logs=[tmp_path / "missing.log"])
    assert (exited.cause, exited.message) == (
        "exited",
        "the sandbox's runtime exited with status 3",
    )
    gofer_killed = exits.reason(137 << 8, cgroup=NO_CGROUP, logs=[])
    assert gofer_killed.message.endswith("status 137 (128 + SIGKILL)")
    unknown = exits.reason(None, cgroup=NO_CGROUP, logs=[])
    assert unknown.cause == "exited" and "unknown" in unknown.message


def test_a_panic_in_the_logs_is_a_crash_whatever_the_status(tmp_path: Path) -> None:
    log = tmp_path / "runsc.log.boot.txt"
    log.write_text(
        "I1201 boot.go:1] starting\npanic: runtime error: index out of range [3]\n"
        "goroutine 1 [running]:\n"
    )
    crashed = exits.reason(2 << 8, cgroup=NO_CGROUP, logs=[tmp_path / "console.log", log])
    assert crashed.cause == "crashed"
    assert crashed.message.endswith("panic: runtime error: index out of range [3]")
