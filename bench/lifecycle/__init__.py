"""Lifecycle benchmark: create from a template image, pause/resume, snapshot, fork, aging,
density, idle CPU, command round trip (issues 4 and 11).

Starts one real node server (``tests/server/harness.py``: gVisor sandboxes of the ``base``
template, whose memory image the node makes at start; the default warm pool of restored
sandboxes) and drives it with the official e2b Python SDK through the node, as the server
tests do. Next to every operation that has one, the same thing is done with bare ``runsc``
on an equivalent sandbox (the node's own OCI config: envd as init, same mounts, limits and
runsc flags; ``--network=none``, our own ``--root``), interleaved round by round:

1. **create** from the template: ``Sandbox.create()`` then the first ``commands.run("true")``
   (warm pool on, refilled before every round). Bare: ``runsc restore -detach`` from a
   checkpoint of a booted envd sandbox + the first ``runsc exec true``.
2. **pause / resume**: ``pause()`` (hot: freeze) and ``Sandbox.connect()`` right after
   (thaw); then pause again and wait until the node wrote it to disk (``<home>/paused/<id>``
   and the ``paused … to disk`` log line), check that no process of it is left (memory 0),
   and ``connect()`` (restore). Bare: ``runsc pause`` / ``resume``, ``runsc checkpoint``
   (the sandbox exits) and ``restore -detach`` + first ``exec``.
3. **snapshot** of a sandbox with ~0, 10 and 50 MiB written to /home/user
   (``create_snapshot()``; the snapshot is deleted, untimed). Bare: ``runsc checkpoint
   --leave-running --compression=none`` of a bare sandbox holding the same file.
4. **fork** x1, x4, x16: from the ``fork()`` call until every child answered
   ``commands.run("true")``. Bare: one ``checkpoint --leave-running`` + N concurrent
   ``restore -detach`` + ``exec true``.
5. **aging**: snapshot and fork x4 on a fresh sandbox, then after 1,000 ``commands.run``
   calls (``ps aux``, ``node -e 0``, ``true`` in turn, 4 threads), again.
6. **density**: PSS of every host process of 1 idle sandbox vs 16 idle fork children of it
   (and the same for bare runsc: one sandbox vs 16 restores of its checkpoint).

7. **idle CPU**: sentry + gofer (+ systrap stubs) utime + stime from ``/proc`` of an idle
   sandbox over a window, against a bare sandbox whose init is ``/bin/sleep``.
8. **first command**: ``commands.run("true")`` on a warm sandbox, against ``bash -l -c true``
   spawned by a shell loop inside the sandbox (timed there with ``date +%s%N``).

The node runs the product defaults (disk workspaces, the pre-created and warm pools);
``--workspace memory`` switches, and ``--fork-both-modes`` (on by default) repeats the fork
x16 rows on a second node with memory workspaces, whose forks can use pre-created sandboxes.
The issue 11 table (``headline``) is printed first, then every row.

Writes bench/results/lifecycle.json, docs/img/lifecycle.svg (p50 bars with p95 whiskers
against each target, bare runsc marked), and prints a markdown report (copied into
docs/benchmarks.md). Missed targets are findings: the exit status is non-zero only when an
operation failed or the server logged a traceback.
"""

import os

# Other engineers run test servers on other slot ranges of this machine: ours is 48000-48999
# (the harness gives each server 100 of them). Set before the harness reads it.
os.environ.setdefault("AENV_TEST_SLOT_BASE", "48000")
