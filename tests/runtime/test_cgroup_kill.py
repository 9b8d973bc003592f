"""``cgroups.kill_left``: what a sandbox's cgroup still holds after runsc's delete is killed,
frozen or not (a frozen process ignores SIGKILL until thawed). Real cgroups, under a test
parent of their own, with plain ``sleep`` processes in them."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.runtime import cgroups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")

FREEZER = cgroups.CGROUP_ROOT / "freezer"


@pytest.fixture
def cgroup() -> Iterator[str]:
    relative = f"aenv-test/{secrets.token_hex(4)}"
    made = []
    for hierarchy in ("pids", "freezer"):
        path = cgroups.CGROUP_ROOT / hierarchy / relative
        if path.parent.parent.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            made.append(path)
    if not made:
        pytest.skip("no v1 pids or freezer hierarchy here")
    yield relative
    cgroups.remove(relative)
    for path in made:
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def _start_in(relative: str, count: int) -> list[subprocess.Popen[bytes]]:
    started = []
    for _ in range(count):
        process = subprocess.Popen(["sleep", "600"])
        for hierarchy in ("pids", "freezer"):
            procs = cgroups.CGROUP_ROOT / hierarchy / relative / "cgroup.procs"
            if procs.exists():
                procs.write_text(str(process.pid))
        started.append(process)
    return started


@pytest.mark.parametrize("frozen", [False, True])
def test_what_the_cgroup_still_holds_is_killed(cgroup: str, frozen: bool) -> None:
    if frozen and not (FREEZER / cgroup).is_dir():
        pytest.skip("no v1 freezer here")
    started = _start_in(cgroup, 3)
    assert cgroups.processes(cgroup) == {p.pid for p in started}
    if frozen:
        (FREEZER / cgroup / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 5
        while (FREEZER / cgroup / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert cgroups.kill_left(cgroup) == {p.pid for p in started}
    for process in started:
        assert process.wait(timeout=5) == -9
    assert cgroups.processes(cgroup) == set()
    assert cgroups.kill_left(cgroup) == set()
    cgroups.remove(cgroup)
    assert not any(Path(p).is_dir() for p in cgroups._everywhere(cgroup))
