"""envd, the sandbox's init, reaps the orphans a command leaves (envd/orphans.py) and leaves
its own children to whoever waits for them. Runs in a child interpreter that is a subreaper,
as envd is init: orphans are handed to it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import ctypes, os, subprocess, time
from aenv.envd import orphans

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"

# A command (a session leader, as envd starts every command) whose background child outlives
# it: the child is handed to us and becomes a zombie in the command's session.
cmd = subprocess.Popen(["sh", "-c", "sleep 0.3 & echo $!"], stdout=subprocess.PIPE,
                       start_new_session=True, text=True)
orphan = int(cmd.stdout.readline())
cmd.wait()
# A command that has ended and not been waited for yet, and a helper in our own session:
# both are someone's to wait for.
leader = subprocess.Popen(["true"], start_new_session=True)
helper = subprocess.Popen(["true"])
deadline = time.monotonic() + 30
while {state(orphan), state(leader.pid), state(helper.pid)} != {"Z"}:
    assert time.monotonic() < deadline, (state(orphan), state(leader.pid), state(helper.pid))
    time.sleep(0.05)
print(orphans.reap(), state(orphan), state(leader.pid), state(helper.pid),
      leader.wait(), helper.wait())
"""


def test_orphans_are_reaped_and_own_children_left_to_their_waiters() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=True)
    # One reaped (gone); the two of ours still zombies, their exit statuses intact.
    assert done.stdout.split() == ["1", "gone", "Z", "Z", "0", "0"], done.stderr
