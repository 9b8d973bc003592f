"""Node server benchmark: create latency, bare runsc baseline, round trips, concurrency, memory.

Starts real node servers (``tests/server/harness.py``: gVisor sandboxes of the ``base``
template, the shared layer cache, ``build/envd-bundle``) and drives them with the official
Python SDK through the node's proxy (``E2B_API_URL=E2B_SANDBOX_URL=<node>``), as the server
tests do. Every number is put next to the layer underneath it, so a miss can be attributed:

1. **create → first command**: ``Sandbox.create()`` then ``commands.run("true")``, each part
   timed; the server's own per-phase log line (``created <id> (cold) in N ms: slot ..,
   rootfs .., boot .., envd_ready .., init ..``) is parsed when it is there, and the CPU of
   the sandbox's cgroup and of the server is recorded. Measured on a node with the
   warm pool off (*cold*: every create boots a sandbox) and, when the server has one, on a
   node with its default warm pool (*warm*: the pool is refilled before each timed create).
2. **bare runsc baseline**, interleaved with (1): ``runsc run -detach`` of an equivalent OCI
   bundle (the base template's layer as a read-only root, ``sleep 1000`` as init, the node's
   runsc flags, cgroup limits and resources; ``--network=none``) and the first ``runsc exec
   … /bin/true`` answered, in our own ``--root`` with fixed-length container ids.
3. **round trip**: SDK ``commands.run("true")``; the same Connect ``Start`` sent raw with
   httpx through the proxy and with http.client straight to the guest (socket bound to the
   slot's veth, no proxy); ``/bin/true`` instead of ``bash -l``; ``GET /health`` through the
   proxy, straight to the guest and of the node itself; plus the bare spawn cost of
   ``bash -l -c true`` and ``/bin/true`` timed by a loop inside the sandbox.
4. **concurrency**: N creates at once (threads) on the cold node, wall time until every one
   answered a command, and per-create p50/p95.
5. **memory**: PSS (``/proc/<pid>/smaps_rollup``) of every process of a sandbox (its cgroup
   ``/aenv/<id>`` in every v1 controller, plus any process whose command line names the id:
   runsc sandbox/sentry, gofer, systrap stubs) after it idled, for N sandboxes; the memory
   cgroup's own accounting and envd's RSS as the guest sees it as cross-checks.

Writes bench/results/node.json and prints a markdown report (copied into docs/benchmarks.md).
Missed targets are findings, not failures: the exit status is non-zero only when something
broke (a create or command failed, a server logged a traceback).

The parts, one module each, run by ``__main__`` in this order: ``create`` (1 and 2, with the
bare runtime of ``bare``), ``round_trip`` (3), ``concurrency`` (4), ``memory`` (5). ``node``
starts, stops and cleans up the node servers; ``common`` holds the targets, the result types
and the timers; ``report`` the targets' verdicts and the markdown.
"""
