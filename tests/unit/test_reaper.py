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


def test_adopted_zombies_are_reaped_and_own_children_left_to_asyncio() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=True)
    # The orphan is too young at first, reaped once old enough; the node's own child still
    # reports its exit status (7), not asyncio's 255 for a child someone else reaped.
    assert done.stdout.split() == ["0", "1", "7"], done.stderr
