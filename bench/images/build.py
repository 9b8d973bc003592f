"""Part 2: build time of a three-step template, with and without the step cache.

The template (E2B SDK ``Template`` builder, ``Template.build`` against the node): FROM the
``debian`` test image of the local registry, ``COPY hello.txt /app/hello.txt``, ``WORKDIR
/app`` + ``ENV GREETING=hi``, ``RUN echo <x> > built.txt``; then the node boots the final
sandbox and takes its memory image. One untimed build first (pulls the image if it is not,
fills the step cache). Then rounds of three builds, interleaved:

* **forced**: ``skip_cache()`` right after FROM: every step re-runs (the image is not
  pulled again; that is ``Template.build(skip_cache=True)``, not measured here),
* **last step changed**: a new ``RUN`` command (COPY comes from the cache),
* **nothing changed**: the previous build again (every step from the cache),

and the bare parts of a build, once per round, with bare ``runsc`` over the same image layer
(``lifecycle_bench.BareEnvd``: the node's OCI config with envd as init): a cold boot until envd
listens, one ``exec`` of the RUN command, ``checkpoint`` (the sandbox exits), each ``delete``
(``runsc delete --force``, unmount, remove) timed too. A RUN step is a
cold boot of its own build sandbox, and the memory image is another cold boot + checkpoint, so
the bare floor of a build with a RUN step is a RUN sandbox (boot + exec + delete) plus a
final one (boot + checkpoint + delete), and of a build with every step cached the final one.
Per-step times come from the build log's timestamps (the node's clock): the gap from one
step's first line to the next's.
"""

from __future__ import annotations

import itertools
import statistics
import time
from datetime import datetime
from typing import Any

from bench.images.common import DEFAULT_CPU, DEFAULT_MEMORY_MB, Bench
from bench.lifecycle_bench import BareEnvd, Row, log, rm_image
from bench.node_bench.common import ms_since

#: Build log lines that open a phase (first match wins), in build order.
MARKS = (
    ("FROM ", "base"),
    ("COPY ", "copy"),
    ("WORKDIR ", "workdir"),
    ("ENV ", "env"),
    ("RUN ", "run"),
    ("starting the template sandbox", "memory_image"),
    ("memory image taken", "teardown"),
)
DONE_MARK = " built in "
PHASE_TEXT = {
    "base": "FROM",
    "copy": "COPY",
    "workdir": "WORKDIR",
    "env": "ENV",
    "run": "RUN",
    # "memory image taken" is logged after the repository commit, and the build ends only
    # once the final sandbox is destroyed (ops/build.py: _finalize's ``finally``).
    "memory_image": "boot + init + checkpoint + commit",
    "teardown": "teardown of the final sandbox",
}
RUN_COMMAND = "echo {} > built.txt"


def _template(b: Bench, command: str, *, force: bool) -> Any:
    from e2b import Template

    context = b.scratch / "context"
    context.mkdir(exist_ok=True)
    (context / "hello.txt").write_text("hello from the build context\n")
    template = Template(file_context_path=str(context)).from_image(b.images["debian"].ref)
    if force:
        template = template.skip_cache()
    return (
        template.copy("hello.txt", "/app/hello.txt")
        .set_workdir("/app")
        .set_envs({"GREETING": "hi"})
        .run_cmd(command)
    )


def build_once(b: Bench, command: str, *, force: bool) -> dict[str, Any]:
    """One ``Template.build`` of the benchmark's template: wall ms and the phases its log
    shows (ms, by the node's timestamps)."""
    from e2b import Template

    entries: list[Any] = []
    opts = b.node.sdk_opts()
    start = time.perf_counter()
    Template.build(
        _template(b, command, force=force),
        b.template,
        on_build_logs=entries.append,
        api_key=opts["api_key"],
        api_url=opts["api_url"],
        domain=opts["domain"],
    )
    wall_ms = ms_since(start)
    server = [(e.timestamp, e.message) for e in entries if _aware(e.timestamp)]
    times: dict[str, datetime] = {}
    for stamp, message in server:
        for prefix, phase in MARKS:
            if message.startswith(prefix) and phase not in times:
                times[phase] = stamp
                break
        if DONE_MARK in message and "end" not in times:
            times["end"] = stamp
    order = [phase for _, phase in MARKS if phase in times] + (["end"] if "end" in times else [])
    phases = {
        phase: (times[following] - times[phase]).total_seconds() * 1000
        for phase, following in itertools.pairwise(order)
    }
    if "base" in times and "end" in times:
        phases["server_total"] = (times["end"] - times["base"]).total_seconds() * 1000
    return {
        "wall_ms": wall_ms,
        "phases_ms": phases,
        "cached_steps": sum(1 for _, m in server if m.strip() == "CACHED"),
        "log": [m for _, m in server][-40:],
    }


def _aware(stamp: Any) -> bool:
    return isinstance(stamp, datetime) and stamp.tzinfo is not None


def ensure_template(b: Bench) -> None:
    """The benchmark's template exists (built once, untimed, if no part built it yet)."""
    if b.template_ready:
        return
    started = time.perf_counter()
    build_once(b, RUN_COMMAND.format("warm-up"), force=False)
    b.template_ready = True
    log(f"  template {b.template} built in {ms_since(started):.0f} ms (untimed)")


def bare_parts(bare: BareEnvd) -> dict[str, float]:
    """The parts of a build, bare (ms each): a RUN step's sandbox (cold boot until envd
    listens, exec of the command, delete while it runs) and the final one (cold boot,
    checkpoint: the sandbox exits, delete)."""
    out: dict[str, float] = {}
    start = time.perf_counter()
    cid = bare.boot()
    out["boot"] = ms_since(start)
    out["exec"] = bare.exec(cid, "/bin/sh", "-c", "echo bare > /tmp/built.txt")
    start = time.perf_counter()
    bare.delete(cid)
    out["delete_running"] = ms_since(start)
    start = time.perf_counter()
    cid = bare.boot()
    out["boot_final"] = ms_since(start)
    try:
        out["checkpoint"], image, _ = bare.checkpoint(cid, leave_running=False)
        rm_image(image)
    finally:
        start = time.perf_counter()
        bare.delete(cid)
        out["delete_exited"] = ms_since(start)
    out["run_step"] = out["boot"] + out["exec"] + out["delete_running"]
    out["final"] = out["boot_final"] + out["checkpoint"] + out["delete_exited"]
    return out


VARIANTS = (
    ("forced", "build, forced (skip_cache() after FROM): every step + memory image"),
    ("changed", "rebuild, last step (RUN) changed"),
    ("unchanged", "rebuild, nothing changed"),
)


def measure_build(b: Bench, rounds: int) -> None:
    report = b.report
    ensure_template(b)
    bare = BareEnvd([b.node.layer(b.images["debian"].layer_ids[0])], DEFAULT_CPU, DEFAULT_MEMORY_MB)
    try:
        for r in range(rounds):
            command = RUN_COMMAND.format(f"round-{r}-{time.time_ns()}")
            for variant, force, cmd in (
                ("forced", True, RUN_COMMAND.format("forced")),
                ("changed", False, command),
                ("unchanged", False, command),
            ):
                result = build_once(b, cmd, force=force)
                report.add(f"build_{variant}", result["wall_ms"])
                report.add(f"build_{variant}_detail", result)
                log(
                    f"  build {r + 1}/{rounds} {variant}: {result['wall_ms']:.0f} ms, "
                    f"{result['cached_steps']} cached steps, "
                    + ", ".join(f"{k} {v:.0f}" for k, v in result["phases_ms"].items())
                )
            parts = bare_parts(bare)
            for key, value in parts.items():
                report.add(f"build_bare_{key}", value)
            report.add("build_bare_both", parts["run_step"] + parts["final"])
            log("  bare: " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    finally:
        bare.close()
    _rows(b)


def _rows(b: Bench) -> None:
    report = b.report
    two = report.lat("build_bare_both")
    one = report.lat("build_bare_final")
    for variant, name in VARIANTS:
        details = report.samples.get(f"build_{variant}_detail", [])
        phases: dict[str, float] = {}
        for key in details[0]["phases_ms"] if details else []:
            values = [d["phases_ms"][key] for d in details if key in d["phases_ms"]]
            phases[key] = round(statistics.median(values), 1)
        cached = [d["cached_steps"] for d in details]
        report.phases[f"build_{variant}"] = {"phases_p50_ms": phases, "cached_steps": cached}
        bare, bare_name = (
            (one, "boot + checkpoint + delete")
            if variant == "unchanged"
            else (two, "RUN (boot + exec + delete) + boot + checkpoint + delete")
        )
        report.rows.append(
            Row(
                "build",
                name,
                report.lat(f"build_{variant}"),
                bare,
                bare_name,
                note=f"{max(cached, default=0)} steps cached",
                plot_name=name.split(":")[0],
            )
        )
        text = ", ".join(
            f"{PHASE_TEXT.get(k, k)} {v:.0f}" for k, v in phases.items() if k != "server_total"
        )
        report.rows.append(
            Row(
                "build",
                f"{variant}: node log p50 ms: {text}; node total "
                f"{phases.get('server_total', 0):.0f}",
                None,
                plot=False,
            )
        )
    report.rows += [
        Row(
            "build",
            "bare RUN step: boot until envd listens + exec + delete (running)",
            report.lat("build_bare_run_step"),
            plot=False,
        ),
        Row(
            "build", "bare: cold boot until envd listens", report.lat("build_bare_boot"), plot=False
        ),
        Row(
            "build",
            "bare: runsc delete --force of a running sandbox (+ umount, rm)",
            report.lat("build_bare_delete_running"),
            plot=False,
        ),
        Row(
            "build",
            "bare final sandbox: boot + checkpoint (exits) + delete",
            report.lat("build_bare_final"),
            plot=False,
        ),
        Row(
            "build",
            "bare: checkpoint (sandbox exits)",
            report.lat("build_bare_checkpoint"),
            plot=False,
        ),
        Row(
            "build",
            "bare: delete after the checkpoint (+ umount, rm)",
            report.lat("build_bare_delete_exited"),
            plot=False,
        ),
    ]
