"""Part 1: cold start of an image the node never pulled, and of the same image again.

Each round, per image: (a) **uncached**: the node forgets the image (``common.uncache``:
records, blobs, unpacked layers), then ``POST /sandboxes-cold`` → ``Sandbox.connect`` → first
``commands.run("true")`` answered; (b) **cached**: the same again; (c) the bare pull: the
node's own ``skopeo copy`` command line into an empty blob directory, then ``tar -xzf`` of
each layer blob; (d) bare ``runsc run -detach`` + first ``runsc exec true`` over the same
layer (``node_bench.bare.BareRunsc``: the node's OCI config with ``sleep`` as init, no network,
on a hard-linked copy of the layer, so deleting the node's copy cannot touch it), and (e) a
bare cold boot with envd as init until it listens (``lifecycle_bench.BareEnvd``). Every
sandbox is killed (untimed) before the next step. The node's log gives the pull and unpack
times (from the timestamps of its ``pulled …`` and ``unpacked layer …`` lines) and the create
phases.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from aenv.runtime import oci
from aenv.storage.image_reference import parse_reference
from aenv.storage.skopeo import Skopeo
from bench.images.common import (
    DEFAULT_CPU,
    DEFAULT_MEMORY_MB,
    PULLED_RE,
    UNPACKED_RE,
    Bench,
    TestImage,
    link_copy,
    log_time,
    seconds_ms,
    uncache,
    wait_unmounted,
)
from bench.lifecycle_bench import BareEnvd, Row, log, run_true
from bench.node_bench.bare import BareRunsc
from bench.node_bench.common import ms_since

PHASES = ("slot", "rootfs", "boot", "envd_ready", "init")


class BareEnvdBoot(BareEnvd):
    """lifecycle_bench's bare envd sandbox, with envd run as ``user`` and no workdir (what the
    node does for an image without a ``user`` account): a cold boot until envd listens."""

    def __init__(self, lowers: list[Path], user: str) -> None:
        super().__init__(lowers, DEFAULT_CPU, DEFAULT_MEMORY_MB)
        self.user = user

    def _prepare(self) -> tuple[str, Path]:
        cid, bundle = super()._prepare()
        config = oci.read_config(bundle)
        args = config["process"]["args"]
        config["process"]["args"] = [*args[: args.index("--user")], "--user", self.user]
        oci.write_config(bundle, config)
        return cid, bundle

    def boot_ms(self) -> float:
        start = time.perf_counter()
        cid = self.boot()
        elapsed = ms_since(start)
        self.delete(cid)
        return elapsed


def cold_once(b: Bench, image: TestImage) -> dict[str, Any]:
    """One cold start until the first command answered; the sandbox is killed afterwards."""
    node = b.node
    pulls, unpacks = len(node.matches(PULLED_RE)), len(node.matches(UNPACKED_RE))
    requested = time.time()
    sandbox_id, post_ms = node.cold_start(image.ref)
    try:
        start = time.perf_counter()
        sandbox = node.connect(sandbox_id)
        connect_ms = ms_since(start)
        first_ms = run_true(sandbox)
        lowers = node.lowers(sandbox_id)
    finally:
        node.kill(sandbox_id)
    if not wait_unmounted(node.server.home, sandbox_id):
        b.report.errors.append(f"cold: rootfs of {sandbox_id} still mounted after its kill")
    created = node.created().get(sandbox_id, {})
    pulled = [m for m in node.matches(PULLED_RE)[pulls:] if m["ref"] == image.ref]
    unpacked = [m for m in node.matches(UNPACKED_RE)[unpacks:] if m["ref"] == image.ref]
    # From the log lines' timestamps (ms): the pull from the request to its ``pulled`` line,
    # the unpack (digest check + unpack of every layer) from there to the last ``unpacked``.
    pull_ms = unpack_ms = None
    if pulled:
        pulled_at = log_time(pulled[0]["ts"])
        pull_ms = (pulled_at - requested) * 1000
        if unpacked:
            unpack_ms = (log_time(unpacked[-1]["ts"]) - pulled_at) * 1000
    return {
        "sandbox_id": sandbox_id,
        "post_ms": post_ms,
        "connect_ms": connect_ms,
        "first_command_ms": first_ms,
        "total_ms": post_ms + connect_ms + first_ms,
        "pull_ms": pull_ms,
        "unpack_ms": unpack_ms,
        "pull_log_ms": sum(seconds_ms([m["s"] for m in pulled])) if pulled else None,
        "unpack_log_ms": sum(seconds_ms([m["s"] for m in unpacked])) if unpacked else None,
        "created": created,
        "lowers": [str(p) for p in lowers],
    }


def bare_pull(image: TestImage, scratch: Path) -> tuple[float, float]:
    """The node's ``skopeo copy`` into an empty blob directory, then ``tar -xzf`` of every
    layer blob: (copy ms, unpack ms)."""
    work = Path(tempfile.mkdtemp(prefix="pull-", dir=scratch))
    try:
        skopeo = Skopeo(work / "blobs")
        (work / "pull" / "tmp").mkdir(parents=True)
        argv = skopeo.copy_argv(parse_reference(image.ref), work / "pull", authfile=None)
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        copy_ms = ms_since(start)
        unpack_ms = 0.0
        for index, layer in enumerate(image.built.layers):
            blob = work / "blobs" / "sha256" / layer.digest.partition(":")[2]
            dest = work / f"layer-{index}"
            dest.mkdir()
            start = time.perf_counter()
            subprocess.run(["tar", "-xzf", str(blob), "-C", str(dest)], check=True)
            unpack_ms += ms_since(start)
        return copy_ms, unpack_ms
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_cold(b: Bench, runs: dict[str, int], warmup: int) -> None:
    report = b.report
    for position, (name, count) in enumerate(runs.items()):
        image = b.images[name]
        bare: BareRunsc | None = None
        envd: BareEnvdBoot | None = None
        kept: Path | None = None
        warm = warmup if position == 0 else 0  # the node's very first cold starts
        try:
            for i in range(count + warm):
                uncache(b.node, image)
                uncached = cold_once(b, image)
                if bare is None:
                    if len(uncached["lowers"]) != 1:
                        raise RuntimeError(f"{name}: expected one layer, got {uncached['lowers']}")
                    kept = Path(tempfile.mkdtemp(prefix=f"rootfs-{name}-", dir=b.scratch))
                    link_copy(Path(uncached["lowers"][0]), kept / "layer")
                    bare = BareRunsc(kept / "layer", DEFAULT_CPU, DEFAULT_MEMORY_MB)
                    envd = BareEnvdBoot([kept / "layer"], _user(kept / "layer"))
                cached = cold_once(b, image)
                copy_ms, tar_ms = bare_pull(image, b.scratch)
                bare_run = bare.once()
                assert envd is not None
                envd_ms = envd.boot_ms()
                log(
                    f"  {name} {i + 1 - warm}/{count}: uncached {uncached['total_ms']:.0f} ms "
                    f"(pull {uncached['pull_ms'] or 0:.0f}, unpack "
                    f"{uncached['unpack_ms'] or 0:.0f}), cached "
                    f"{cached['total_ms']:.0f} ms; bare skopeo {copy_ms:.0f} + tar {tar_ms:.0f}"
                    f" + runsc {bare_run.total_ms:.0f} ms; bare envd boot {envd_ms:.0f} ms"
                )
                if i < warm:
                    continue
                report.add(f"cold_{name}_uncached", uncached)
                report.add(f"cold_{name}_cached", cached)
                report.add(f"cold_{name}_uncached_total", uncached["total_ms"])
                report.add(f"cold_{name}_cached_total", cached["total_ms"])
                report.add(f"cold_{name}_cached_post", cached["post_ms"])
                report.add(f"cold_{name}_uncached_post", uncached["post_ms"])
                for key in ("pull_ms", "unpack_ms"):
                    if uncached[key] is not None:
                        report.add(f"cold_{name}_node_{key}", uncached[key])
                report.add(f"cold_{name}_bare_copy", copy_ms)
                report.add(f"cold_{name}_bare_tar", tar_ms)
                report.add(f"cold_{name}_bare_runsc", bare_run.total_ms)
                report.add(f"cold_{name}_bare_envd", envd_ms)
                report.add(f"cold_{name}_bare_uncached", copy_ms + tar_ms + bare_run.total_ms)
                for kind, sample in (("uncached", uncached), ("cached", cached)):
                    phases = sample["created"]
                    if "total" in phases:
                        report.add(f"cold_{name}_{kind}_server", phases["total"])
                        # What the POST spent outside the pull, the unpack and the create.
                        rest = sample["post_ms"] - phases["total"]
                        rest -= (sample["pull_ms"] or 0) + (sample["unpack_ms"] or 0)
                        report.add(f"cold_{name}_{kind}_post_rest", rest)
        finally:
            if bare is not None:
                bare.close()
            if envd is not None:
                envd.close()
            if kept is not None:
                shutil.rmtree(kept, ignore_errors=True)
        _rows(b, image)


def _user(layer: Path) -> str:
    """Who the node runs an image's envd as when the image names no USER (ops/build.py
    ``default_user``): ``user`` if the image has that account, else root."""
    passwd = layer / "etc" / "passwd"
    lines = passwd.read_text().splitlines() if passwd.is_file() else []
    return "user" if any(line.startswith("user:") for line in lines) else "root"


def _phase_p50(samples: list[dict[str, Any]]) -> str:
    parts = []
    for phase in PHASES:
        values = [s["created"][phase] for s in samples if phase in s["created"]]
        if values:
            parts.append(f"{phase} {statistics.median(values):.0f}")
    return ", ".join(parts)


def _rows(b: Bench, image: TestImage) -> None:
    report, name = b.report, image.name
    lat = report.lat
    key = f"cold_{name}"
    size = f"{image.blob_bytes / (1 << 20):.1f} MiB compressed"
    uncached = report.samples.get(f"{key}_uncached", [])
    cached = report.samples.get(f"{key}_cached", [])
    report.phases[key] = {
        "uncached_phases_p50": _phase_p50(uncached),
        "cached_phases_p50": _phase_p50(cached),
        "blob_bytes": image.blob_bytes,
    }
    report.rows += [
        Row(
            "cold",
            f"cold start {name}, uncached → first command",
            lat(f"{key}_uncached_total"),
            lat(f"{key}_bare_uncached"),
            "skopeo copy + tar -xzf + runsc run + exec",
            note=size,
            plot_name=f"{name} uncached: POST → first command",
        ),
        Row(
            "cold",
            f"cold start {name}, cached → first command",
            lat(f"{key}_cached_total"),
            lat(f"{key}_bare_runsc"),
            "runsc run -detach + first exec",
            plot_name=f"{name} cached: POST → first command",
        ),
        Row(
            "cold",
            f"{name} cached → first command, next to a bare boot with envd as init",
            lat(f"{key}_cached_total"),
            lat(f"{key}_bare_envd"),
            "runsc run (envd init) until envd listens",
            plot=False,
        ),
        Row(
            "cold",
            f"{name} uncached: node pull (request → `pulled` log line)",
            lat(f"{key}_node_pull_ms"),
            lat(f"{key}_bare_copy"),
            "skopeo copy (same argv)",
            plot=False,
        ),
        Row(
            "cold",
            f"{name} uncached: node unpack (`pulled` → `unpacked` log line)",
            lat(f"{key}_node_unpack_ms"),
            lat(f"{key}_bare_tar"),
            "tar -xzf",
            plot=False,
        ),
        Row(
            "cold",
            f"{name} cached: node create (log: {report.phases[key]['cached_phases_p50']})",
            lat(f"{key}_cached_server"),
            lat(f"{key}_bare_runsc"),
            "runsc run -detach + first exec",
            plot=False,
        ),
        Row(
            "cold",
            f"{name}: POST outside pull, unpack and create (uncached / cached p50 "
            f"{_p50(report, f'{key}_uncached_post_rest')} / "
            f"{_p50(report, f'{key}_cached_post_rest')} ms)",
            None,
            plot=False,
        ),
    ]


def _p50(report: Any, key: str) -> str:
    values = [v for v in report.samples.get(key, []) if isinstance(v, int | float)]
    return f"{statistics.median(values):.0f}" if values else "?"
