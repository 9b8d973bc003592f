"""The host probes run real ``runsc do`` sandboxes: every platform gets a verdict with its reason,
within the timeout, and nothing of a probe outlives it (timeout and cancellation included).

Which platform works is this host's business (the doctor prints it), so nothing here names the
answer: the tests ask that the verdicts be consistent and complete.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.core.proc import TERMINATE_GRACE_S
from aenv.runtime.host_probe import (
    GVISOR_PLATFORMS,
    KILL_WAIT_S,
    PLATFORM_TIMEOUT_S,
    HostCheck,
    probe_fake,
    probe_gvisor,
    probe_gvisor_platform,
    working_platforms,
)

pytestmark = [pytest.mark.anyio, pytest.mark.gvisor]

#: What a probe may add to its timeout: proc.run's SIGTERM grace, the clean-up's runsc delete
#: (its PID 1 reaps slowly here) and the wait for killed leftovers.
CLEANUP_SLACK_S = TERMINATE_GRACE_S + KILL_WAIT_S + 10.0


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Short: runsc's control socket lives under it (a Unix socket path has 107 bytes).
    path = Path(tempfile.mkdtemp(prefix="hp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def leftovers(scratch: Path) -> list[str]:
    """Files a probe left in ``scratch`` and live processes naming it."""
    found = [str(p) for p in scratch.iterdir()]
    marker = str(scratch).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"pid {entry}: {shown}")
    return found


async def test_every_platform_gets_a_verdict_within_the_timeout(scratch: Path) -> None:
    started = time.monotonic()
    checks = await probe_gvisor(scratch=scratch)
    took = time.monotonic() - started
    print("\n".join(f"{c.status} {c.name}: {c.reason}" for c in checks), f"({took:.1f} s)")
    assert checks[0].name == "runtime gvisor" and checks[0].status == "ok", checks[0]
    assert checks[0].platform is None
    assert [c.platform for c in checks[1:]] == list(GVISOR_PLATFORMS)
    for check in checks[1:]:
        assert check.name == f"runtime gvisor ({check.platform})"
        if check.status == "ok":
            assert check.reason.startswith("ran a process in "), check
        else:
            assert check.status == "fail", check
            assert check.reason.startswith(("did not run a process in",
                                            "runsc exited with status")), check
    # A node's test host runs gVisor sandboxes on some platform.
    assert working_platforms(checks), checks
    # Platforms are tried at once: a spinning one costs its timeout once, not per platform.
    assert took < PLATFORM_TIMEOUT_S + CLEANUP_SLACK_S
    assert leftovers(scratch) == []


async def test_an_impossible_platform_fails_with_runscs_words(scratch: Path) -> None:
    check = await probe_gvisor_platform("nosuchplatform", scratch=scratch)
    assert check == HostCheck("fail", "runtime gvisor (nosuchplatform)", check.reason,
                              "nosuchplatform")
    assert check.reason.startswith("runsc exited with status "), check
    assert "nosuchplatform" in check.reason, check  # runsc's last line names it
    assert leftovers(scratch) == []


async def test_a_platform_that_does_not_finish_in_time_is_reported_and_killed(
        scratch: Path) -> None:
    # No sandbox boots in 50 ms: the probe's timeout path, on a platform every runsc has.
    started = time.monotonic()
    check = await probe_gvisor_platform("ptrace", timeout_s=0.05, scratch=scratch)
    assert check.status == "fail", check
    assert check.reason == ("did not run a process in 0.05 s: the ptrace platform spins on this "
                            "host, and was killed"), check
    assert time.monotonic() - started < 0.05 + CLEANUP_SLACK_S
    assert leftovers(scratch) == []


@pytest.mark.parametrize("when", ["at once", "while its sandbox runs"])
async def test_a_cancelled_probe_leaves_nothing(scratch: Path, when: str) -> None:
    task = asyncio.create_task(probe_gvisor_platform("ptrace", scratch=scratch))
    await asyncio.sleep(0)
    if when != "at once":
        # runsc's sandbox process (``runsc-sandbox … boot …``) is up: cancel under it.
        while not any(" boot " in line for line in leftovers(scratch)):
            assert not task.done(), task.result()
            await asyncio.sleep(0.002)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(scratch) == []


async def test_the_fake_runtime_is_always_available() -> None:
    checks = await probe_fake()
    assert [(c.status, c.name, c.platform) for c in checks] == [("ok", "runtime fake", None)]
