"""The subreaper (runtime/reaper.py) reaps adopted processes and never one of the node's own
subprocesses, whose exit status asyncio must still get. Runs in a child interpreter: becoming
a subreaper is for the whole process."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import asyncio, os, time
from aenv.core import proc
from aenv.runtime import reaper

async def main():
    assert reaper.become_subreaper()
    # An orphan: the shell exits at once, its background sleep is adopted by us.
    await proc.run(["sh", "-c", "sleep 0.1 & echo $!"])
    # One of our own, still running while the reaper looks.
    own = asyncio.ensure_future(proc.run(["sh", "-c", "sleep 1.5; exit 7"], check=False))
    await asyncio.sleep(0.3)
    young = reaper.reap_adopted()
    await asyncio.sleep(reaper.MIN_AGE_S)
    old = reaper.reap_adopted()
    done = await own
    print(len(young), len(old), done.returncode)

asyncio.run(main())
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a child interpreter (a subreaper or a child watcher is process-wide)."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)


def test_adopted_zombies_are_reaped_and_own_children_left_to_asyncio() -> None:
    done = _run(SCRIPT)
    # The orphan is too young at first, reaped once old enough; the node's own child still
    # reports its exit status (7), not asyncio's 255 for a child someone else reaped.
    assert done.stdout.split() == ["0", "1", "7"], done.stderr


NAMED = r"""
import asyncio, os, time
from aenv.core import proc
from aenv.runtime import reaper

def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"

async def main():
    assert reaper.become_subreaper()
    # Two orphans adopted by us; only the one named is reaped, and at once (no age rule).
    # Each outlives its shell by far: it is alive when it is handed to us.
    a = int((await proc.run(["sh", "-c", "sleep 1 & echo $!"])).text)
    b = int((await proc.run(["sh", "-c", "sleep 1 & echo $!"])).text)
    deadline = time.monotonic() + 30  # a loaded host may take a while to run them to the end
    while {state(a), state(b)} != {"Z"} and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    first = reaper.reap([a, 999999])
    print(first == [a], state(b) == "Z", reaper.reap([a]) == [])

asyncio.run(main())
"""


def test_reap_takes_only_the_named_adopted_processes() -> None:
    done = _run(NAMED)
    # The named orphan at once (no age rule), not the other (still a zombie, for the sweep);
    # a pid that is nobody's child is no error, and a second reap finds nothing.
    assert done.stdout.split() == ["True", "True", "True"], done.stderr


PIDFD = r"""
import asyncio
from aenv.core import proc

assert proc.watch_children_by_pidfd()

async def main():
    done = await asyncio.gather(*(proc.run(["sh", "-c", f"exit {i}"], check=False)
                                  for i in range(8)))
    print(type(asyncio.get_child_watcher()).__name__, [d.returncode for d in done])

asyncio.run(main())
"""


def test_children_are_watched_by_pidfd_with_their_exit_statuses() -> None:
    done = _run(PIDFD)
    watcher, statuses = done.stdout.strip().split(maxsplit=1)
    assert (watcher, statuses) == ("PidfdChildWatcher", "[0, 1, 2, 3, 4, 5, 6, 7]"), done.stderr
