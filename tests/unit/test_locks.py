"""The start-up locks (aenv.core.locks): one node per home, disjoint slot ranges per machine.

The home lock is a ``flock`` (per open file, so two opens in this process conflict). The slot
range lock is a POSIX record lock, which is per *process*: its conflicts are only visible from
another process, so a child python holds the other range.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.core.errors import FailedPrecondition
from aenv.core.locks import lock_home, lock_slot_range


def test_second_lock_of_a_home_refused_with_the_holders_pid(tmp_path: Path) -> None:
    first = lock_home(tmp_path / "home")
    try:
        assert (tmp_path / "home" / "node.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(FailedPrecondition) as caught:
            lock_home(tmp_path / "home")
        assert caught.value.message == (
            f"another aenv node (pid {os.getpid()}) is using AENV_HOME={tmp_path / 'home'}; "
            "stop it first"
        )
        # Another home is another node.
        lock_home(tmp_path / "other").release()
    finally:
        first.release()
    # Released (or its process gone): the next node gets it and writes its own pid.
    again = lock_home(tmp_path / "home")
    assert (tmp_path / "home" / "node.lock").read_text() == f"{os.getpid()}\n"
    again.release()


_HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from aenv.core.locks import lock_slot_range
    held = lock_slot_range(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[1]))
    print("held", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def other_node(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """Another process holding slots 100..199 of ``<tmp>/slots.lock``: (path, its pid)."""
    path = tmp_path / "run" / "slots.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), "100", "199"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        yield path, child.pid
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("first", "last"), [(150, 250), (50, 100), (199, 199), (1, 60_000), (120, 130)]
)
def test_overlapping_slot_range_refused_naming_the_holder(
    other_node: tuple[Path, int], first: int, last: int
) -> None:
    path, pid = other_node
    with pytest.raises(FailedPrecondition) as caught:
        lock_slot_range(first, last, path)
    assert f"network slots {first}..{last} overlap" in caught.value.message
    assert f"(pid {pid}, slots 100..199)" in caught.value.message


@pytest.mark.parametrize(("first", "last"), [(200, 299), (1, 99), (99, 99), (200, 200)])
def test_disjoint_slot_range_accepted(other_node: tuple[Path, int], first: int, last: int) -> None:
    path, _ = other_node
    lock_slot_range(first, last, path).release()


def test_slot_range_free_again_once_its_holder_died(
    other_node: tuple[Path, int], tmp_path: Path
) -> None:
    path, pid = other_node
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    lock_slot_range(100, 199, path).release()


def test_bad_slot_range_refused(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        lock_slot_range(10, 9, tmp_path / "slots.lock")
