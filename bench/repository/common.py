"""What the parts of the repository benchmark share: rows with a size (throughput), the two node
servers (an S3 repository on moto, the default posix_fs one), and the output.

The nodes are real servers (``tests/server/harness.py``) with ``AENV_PAUSE_HOT_S=0`` (a pause
is written to disk, then published to the repository, at once) and no warm pool (nothing
refills in the background of a timed run). Each has a network-slot range of its own,
:data:`NET_RANGES`, inside this benchmark's block and apart from the other benchmarks' ranges
(lifecycle 48000+, images 44000+, node 50000-50999), so a test session on another block never
meets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.s3 import S3Server
from tests.server.harness import start_server

from aenv.storage.objects import Location, ObjectStore, PosixLocation
from bench.lifecycle_bench import LifecycleNode, Report, Row, log
from bench.node_bench.common import ms_since

MIB = 1 << 20
#: Slots of the two nodes: S3, posix_fs.
NET_RANGES = {"s3": (49600, 49699), "posix_fs": (49700, 49799)}
BACKENDS = ("posix_fs", "s3")
#: The prefix of the node's S3 repository in the moto bucket.
NODE_PREFIX = "node"

#: Node log lines (the logging format starts with the local time, ms resolution).
STAMP = r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"
SPILLED_RE = re.compile(STAMP + r"paused (?P<id>[a-z0-9]{20}) to disk in (?P<ms>\d+) ms")
COMMITTED_RE = re.compile(STAMP + r"committed snapshot (?P<snap>\S+) to ")
SNAPSHOT_RE = re.compile(
    r"snapshot (?P<snap>\S+) of (?P<id>[a-z0-9]{20}) in (?P<total>\d+) ms "
    # "commit N ms" (a cluster's node commits before its answer) or "order, exporting and
    # committing after N ms" (a node alone writes the commit's order and answers).
    r"\(save (?P<save>\d+) ms, disk \d+ ms, (?:commit|order, [a-z, ]+ after) "
    r"(?P<commit>\d+) ms, (?P<mb>[\d.]+) MB\)"
)
RESUMED_RE = re.compile(r"resumed (?P<id>[a-z0-9]{20}) \((?P<how>\w+)\) in (?P<ms>\d+) ms")


@dataclass
class SizedRow(Row):
    """A row whose operation moves ``mib`` MiB: the table shows MiB/s at the p50s."""

    mib: float | None = None


@dataclass
class RepoNode(LifecycleNode):
    """A node server and where its repository is."""

    backend: str = "posix_fs"
    location: Location = field(default_factory=lambda: PosixLocation("posix_fs", Path("/")))

    def instance(self, sandbox_id: str) -> dict[str, Any]:
        """The sandbox record's ``instance`` (read-only from the node's store)."""
        db = self.server.home / "state.db"
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute(
                "SELECT instance FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
            ).fetchone()
        return json.loads(row[0]) if row and row[0] else {}

    def kill(self, sandbox_id: str) -> None:
        from e2b import Sandbox

        with contextlib.suppress(Exception):
            Sandbox.kill(sandbox_id, **self.opts())

    def blob_bytes(self) -> int:
        """Bytes under ``blobs/`` in the node's repository (as the store lists them)."""
        return asyncio.run(store_bytes(self.location, "blobs/"))


async def store_bytes(location: Location, prefix: str) -> int:
    return sum(info.size for info in await ObjectStore(location).list(prefix))


def s3_settings(s3: S3Server) -> dict[str, str]:
    opts = s3.options()
    return {
        "repository": s3.url(NODE_PREFIX),
        "s3_endpoint": opts["endpoint"],
        "s3_region": opts["region"],
        "s3_access_key_id": opts["access_key_id"],
        "s3_secret_access_key": opts["secret_access_key"],
        "s3_allow_http": "true",
    }


def start_repo_node(backend: str, s3: S3Server) -> RepoNode:
    first, last = NET_RANGES[backend]
    settings = {
        "pause_hot_s": "0",
        "warm_pool_size": "0",
        "net_first_index": str(first),
        "net_last_index": str(last),
        **(s3_settings(s3) if backend == "s3" else {}),
    }
    started = time.perf_counter()
    server = start_server(free_port(), None, **settings)
    location: Location = (
        s3.location(NODE_PREFIX)
        if backend == "s3"
        else PosixLocation("posix_fs", server.home / "repository")
    )
    node = RepoNode(backend, server, 0, (first, last), backend=backend, location=location)
    log(f"{backend} node on {server.url} (slots {first}-{last}) up in {ms_since(started):.0f} ms")
    return node


def wait_until(what: str, check: Any, timeout_s: float = 300.0, every_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every_s)


# -- output -----------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _rate(mib: float | None, ms: float | None) -> str:
    return f"{mib / (ms / 1000):.0f}" if mib and ms else ""


def markdown(report: Report) -> str:
    lines = [
        "| Operation | n | p50 ms | p95 ms | MiB/s | bare equivalent | bare p50 / p95 ms "
        "| bare MiB/s | ratio |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in report.rows:
        lat, bare = r.latency, r.bare
        mib = r.mib if isinstance(r, SizedRow) else None
        if lat is not None:
            n, a, b = str(lat.n), _ms(lat.p50_ms), _ms(lat.p95_ms)
        else:
            n, b = "", ""
            a = "" if r.value is None else f"{_ms(r.value)} {r.unit}".rstrip()
        name = r.name + (f" ({r.note})" if r.note else "")
        bare_text = f"{_ms(bare.p50_ms)} / {_ms(bare.p95_ms)}" if bare else ""
        ratio = f"{lat.p50_ms / bare.p50_ms:.2f}x" if lat and bare and bare.p50_ms else ""
        lines.append(
            f"| {name} | {n} | {a} | {b} | {_rate(mib, lat.p50_ms if lat else None)} "
            f"| {r.bare_name} | {bare_text} | {_rate(mib, bare.p50_ms if bare else None)} "
            f"| {ratio} |"
        )
    if report.where:
        lines += ["", *[f"- {w}" for w in report.where]]
    if report.errors:
        lines += ["", "Errors:", *[f"- {e[:600]}" for e in report.errors]]
    return "\n".join(lines)
