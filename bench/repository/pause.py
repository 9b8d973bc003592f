"""Part 2: pause to disk + publish, and resume from disk, with an S3 repository next to the
default posix_fs one.

Both nodes run with ``AENV_PAUSE_HOT_S=0``: a pause freezes the sandbox and writes it to disk at
once (``runsc checkpoint``, the sandbox exits), then publishes it to the repository as the
manifest ``paused-<id>`` (its memory image uploaded on S3, hard-linked on posix_fs); the record
then says ``"published": true``. One sandbox per (backend, size) writes ``mib`` MiB of random
bytes to /home/user (that file lives in the sandbox's memory: ``--overlay2=root:memory``, so it
is in every memory image), then cycles, interleaved between the backends, round 0 a warm-up:

- ``pause()``: the SDK call's own time (it returns once the sandbox is frozen);
- pause → published: from the call until the record says published (state.db polled every
  20 ms), split with the node's log lines into the spill (``paused … to disk in N ms``) and the
  publish (spill line → ``committed snapshot paused-<id>`` line, ms timestamps);
- resume: ``Sandbox.connect()`` (a restore from the local image; the paused manifest is deleted
  from the repository once it runs), then the first ``commands.run("true")``.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from bench.lifecycle_bench import Report, log, run_true
from bench.node_bench.common import ms_since
from bench.repository.common import (
    BACKENDS,
    COMMITTED_RE,
    RESUMED_RE,
    SPILLED_RE,
    RepoNode,
    SizedRow,
    wait_until,
)

SIZES_MIB = (0, 64)
WRITE = "head -c {mib}M /dev/urandom > /home/user/blob && sync"


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000


def cycle(node: RepoNode, sandbox_id: str) -> dict[str, float]:
    """One pause → published → resume; returns the new handle's timings."""
    from e2b import Sandbox

    spilled = node.count(SPILLED_RE, lambda m: m["id"] == sandbox_id)
    committed = node.count(COMMITTED_RE, lambda m: m["snap"] == f"paused-{sandbox_id}")
    resumed = node.count(RESUMED_RE, lambda m: m["id"] == sandbox_id)
    out: dict[str, float] = {}
    start = time.perf_counter()
    if not Sandbox.pause(sandbox_id, **node.opts()):
        raise RuntimeError(f"pause of {sandbox_id}: already paused")
    out["pause_call"] = ms_since(start)
    wait_until(
        f"{sandbox_id} published", lambda: node.instance(sandbox_id).get("published") is True
    )
    out["pause_published"] = ms_since(start)
    spill = node.wait_line(SPILLED_RE, lambda m: m["id"] == sandbox_id, spilled, 10)
    commit = node.wait_line(
        COMMITTED_RE, lambda m: m["snap"] == f"paused-{sandbox_id}", committed, 10
    )
    if spill is not None:
        out["spill_log"] = float(spill["ms"])
        if commit is not None:
            out["publish_log"] = _stamp(commit["ts"]) - _stamp(spill["ts"])
    start = time.perf_counter()
    sandbox = node.connect(sandbox_id)
    out["resume"] = ms_since(start)
    out["first_command"] = run_true(sandbox)
    line = node.wait_line(RESUMED_RE, lambda m: m["id"] == sandbox_id, resumed, 10)
    if line is not None:
        out["resume_log"] = float(line["ms"])
        out["restored"] = float(line["how"] == "restored")
    return out


def measure_pause(
    report: Report, nodes: dict[str, RepoNode], runs: int, sizes: tuple[int, ...] = SIZES_MIB
) -> None:
    for mib in sizes:
        sandboxes: dict[str, Any] = {}
        try:
            for backend in BACKENDS:
                sandboxes[backend] = nodes[backend].create()
                if mib:
                    sandboxes[backend].commands.run(WRITE.format(mib=mib), timeout=300)
            for i in range(runs + 1):
                got = {b: cycle(nodes[b], sandboxes[b].sandbox_id) for b in BACKENDS}
                log(
                    f"  pause {mib} MiB {i}/{runs}: "
                    + "; ".join(
                        f"{b} pause→published {s['pause_published']:.0f} ms, resume "
                        f"{s['resume']:.0f} ms"
                        for b, s in got.items()
                    )
                )
                if i == 0:
                    continue
                for backend, sample in got.items():
                    for key, value in sample.items():
                        report.add(f"pause_{backend}_{mib}_{key}", value)
        finally:
            for backend, sandbox in sandboxes.items():
                nodes[backend].kill(sandbox.sandbox_id)
        _rows(report, mib)


def _rows(report: Report, mib: int) -> None:
    key = f"pause_{{}}_{mib}_{{}}"
    lat = report.lat

    def s3(what: str) -> Any:
        return lat(key.format("s3", what))

    def posix(what: str) -> Any:
        return lat(key.format("posix_fs", what))

    written = f"{mib} MiB written" if mib else "nothing written"
    restored = report.samples.get(key.format("s3", "restored"), [])
    report.rows += [
        SizedRow(
            "pause",
            f"S3, {written}: pause() → published",
            s3("pause_published"),
            posix("pause_published"),
            "posix_fs repository, same",
            mib=None,
            plot_name=f"S3 {mib} MiB: pause → published",
        ),
        SizedRow(
            "pause",
            f"S3, {written}: of which spill to disk (log)",
            s3("spill_log"),
            posix("spill_log"),
            "posix_fs: spill",
            plot=False,
        ),
        SizedRow(
            "pause",
            f"S3, {written}: of which publish (log: spill → committed)",
            s3("publish_log"),
            posix("publish_log"),
            "posix_fs: publish (hard links)",
            mib=None,
            plot_name=f"S3 {mib} MiB: publish",
        ),
        SizedRow(
            "pause",
            f"S3, {written}: pause() call (frozen)",
            s3("pause_call"),
            posix("pause_call"),
            "posix_fs, same",
            plot=False,
        ),
        SizedRow(
            "pause",
            f"S3, {written}: resume from disk, Sandbox.connect()",
            s3("resume"),
            posix("resume"),
            "posix_fs, same",
            note=f"{int(sum(restored))}/{len(restored)} restored",
            plot_name=f"S3 {mib} MiB: resume (connect)",
        ),
        SizedRow(
            "pause",
            f"S3, {written}: resume, node log",
            s3("resume_log"),
            posix("resume_log"),
            "posix_fs, same",
            plot=False,
        ),
        SizedRow(
            "pause",
            f"S3, {written}: first command after resume",
            s3("first_command"),
            posix("first_command"),
            "posix_fs, same",
            plot=False,
        ),
    ]
