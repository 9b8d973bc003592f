"""The lifecycle torture, short form (issue 21; the long form is ``python -m bench.torture``
in ``make bench``): sandboxes with random overlapping operations from several clients, the node
killed with SIGKILL at a random moment and restarted, then every invariant checked — each
sandbox settles, kills answer within 5 s, files survive pause/resume/fork byte for byte, and
nothing leaks (processes, cgroups, mounts, loop devices, network slots, staging, manifests).
"""

from __future__ import annotations

import re

from bench.torture import checks
from bench.torture.run import Plan, run

from tests.server.harness import API_KEY
from tests.server.test_crash_lifecycle import crashable


def test_torture_short_form() -> None:
    with crashable(pause_hot_s="1") as node:
        world = run(node, API_KEY, Plan(seconds=75, sandboxes=6, clients=6, crashes=1))
        said = " ".join(world.violations)
        named = set(re.findall(r"\b[a-z0-9]{20}\b", said)) | set(re.findall(r"slot \d+\b", said))
        if named:
            # The node's own account of each sandbox and slot a violation names (CI keeps no
            # home).
            print(*(line for line in node.server.log().splitlines()
                    if any(re.search(rf"{sid}\b", line) for sid in named)), sep="\n")
    print(checks.report(world))
    assert not world.violations, checks.report(world)
    # It did what it says: every kind of operation ran, and the node was killed.
    ran = {op for (op, _) in world.outcomes}
    assert {"create", "pause", "resume", "fork", "snapshot", "kill", "write", "command",
            "chaos"} <= ran, ran
