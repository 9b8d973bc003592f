"""Part 2: pause / resume, hot (freeze/thaw) and from disk (checkpoint/restore)."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

from bench.lifecycle.bare import (
    BareEnvd,
    rm_image,
)
from bench.lifecycle.common import (
    PAUSE_HOT_S,
    READY_TO_RESUME_RE,
    RESUMED_RE,
    SPILLED_RE,
    TARGET_PAUSE_MS,
    TARGET_PAUSED_MIB,
    TARGET_RESUME_DISK_MS,
    TARGET_RESUME_MS,
    Report,
    Row,
    dir_bytes,
    log,
    p50,
    pss_mib,
    run_true,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.common import MIB, ms_since
from bench.node_bench.memory import sandbox_pids
from bench.node_bench.node import PHASE_RE

# -- 2: pause / resume ------------------------------------------------------------------------


def resumed_line(node: LifecycleNode, sid: str, before: int, how: str) -> re.Match[str]:
    """The node's ``resumed <sid> (<how>)`` line after the ``before``-th one; raises if the
    resume was of the other kind (a thaw measured as a restore, or the reverse)."""
    line = node.wait_line(RESUMED_RE, lambda m: m["id"] == sid, before, 5)
    if line is None or line["how"] != how:
        raise RuntimeError(f"resume of {sid} was not {how}: {line and line[0]}")
    return line


def measure_pause(
    report: Report, node: LifecycleNode, bare: BareEnvd, template: Path, runs: int
) -> None:
    sandbox = node.create()
    sid = sandbox.sandbox_id
    bare_id, _ = bare.restore(template)
    paused_dir = node.server.home / "paused" / sid
    memory: list[dict[str, float]] = []
    try:
        run_true(sandbox)
        bare.exec(bare_id, "/bin/true")
        for i in range(runs + 1):
            # Hot: freeze, thaw at once.
            run_true(sandbox)
            thawed_before = node.count(RESUMED_RE, lambda m: m["id"] == sid)
            start = time.perf_counter()
            if not sandbox.pause():
                raise RuntimeError("pause() answered 'already paused'")
            pause_ms = ms_since(start)
            start = time.perf_counter()
            sandbox = node.connect(sid)
            resume_ms = ms_since(start)
            hot_first = run_true(sandbox)
            hot_server = float(resumed_line(node, sid, thawed_before, "thawed")["ms"])
            # To disk: pause, wait for the image and the spill's log line, resume.
            spilled_before = node.count(SPILLED_RE, lambda m: m["id"] == sid)
            ready_before = node.count(READY_TO_RESUME_RE, lambda m: m["id"] == sid)
            start = time.perf_counter()
            sandbox.pause()
            pause2_ms = ms_since(start)
            paused_at = time.perf_counter()
            while not paused_dir.exists() and ms_since(paused_at) < 120_000:
                time.sleep(0.005)
            image_ms = ms_since(paused_at)
            spill = node.wait_line(SPILLED_RE, lambda m: m["id"] == sid, spilled_before)
            if spill is None:
                raise RuntimeError(f"{sid} was not written to disk within 120 s")
            freed_ms = ms_since(paused_at)
            # Past its hot period a paused sandbox is kept ready to resume (disk workspaces,
            # ``resume_ready.py``): a resume finds it so once that is made, ~0.1 s on.
            ready = node.wait_line(READY_TO_RESUME_RE, lambda m: m["id"] == sid, ready_before,
                                   timeout=10) if node.workspace == "disk" else None
            ready_ms = ms_since(paused_at) - freed_ms if ready is not None else 0.0
            image_bytes = dir_bytes(paused_dir)
            left = sandbox_pids(sid)
            mem = pss_mib(left)
            memory.append(mem)
            restored_before = node.count(RESUMED_RE, lambda m: m["id"] == sid)
            start = time.perf_counter()
            sandbox = node.connect(sid)
            resume_disk_ms = ms_since(start)
            disk_first = run_true(sandbox)
            line = resumed_line(node, sid, restored_before, "restored")
            # Bare: runsc pause/resume; checkpoint (exits) + restore + first exec.
            b_pause = bare.pause(bare_id)
            b_resume = bare.resume(bare_id)
            b_ckpt, image, b_bytes = bare.checkpoint(bare_id, leave_running=False)
            bare.delete(bare_id)
            try:
                bare_id, b_restore = bare.restore(image)
                b_exec = bare.exec(bare_id, "/bin/true")
                # The same image into a sandbox ``runsc create``d ahead (untimed).
                pre_id, b_pre = bare.restore(image, bare.precreate())
                bare.delete(pre_id)
            finally:
                rm_image(image)
            if i == 0:
                continue
            for key, value in [
                ("pause_hot", pause_ms),
                ("pause_to_disk_call", pause2_ms),
                ("resume_hot", resume_ms),
                ("resume_hot_first_command", hot_first),
                ("resume_hot_server", hot_server),
                ("image_on_disk_after_pause", image_ms),
                ("image_on_disk_after_hot_period", image_ms - PAUSE_HOT_S * 1000),
                ("spill_freed_after_pause", freed_ms),
                ("ready_to_resume_after_spill", ready_ms),
                ("spill_server", float(spill["ms"])),
                ("spill_mib", float(spill["mb"]) * 1e6 / MIB),
                ("paused_image_mib", image_bytes / MIB),
                ("paused_processes", mem["processes"]),
                ("paused_pss_mib", mem["pss_mib"]),
                ("resume_disk", resume_disk_ms),
                ("resume_disk_first_command", disk_first),
                ("resume_disk_server", float(line["ms"])),
                *((f"resume_disk_phase_{name}", float(ms))
                  for name, ms in PHASE_RE.findall(line["phases"] or "")),
                ("bare_pause", b_pause),
                ("bare_resume", b_resume),
                ("bare_checkpoint_exit", b_ckpt),
                ("bare_checkpoint_exit_mib", b_bytes / MIB),
                ("bare_restore_resume", b_restore),
                ("bare_restore_resume_precreated", b_pre),
                ("bare_restore_resume_exec", b_exec),
                ("bare_restore_resume_total", b_restore + b_exec),
            ]:
                report.add(key, value)
            log(
                f"  pause {i}/{runs}: pause {pause_ms:.0f}, resume hot {resume_ms:.0f}, "
                f"on disk +{image_ms:.0f} ({image_bytes / MIB:.1f} MiB, "
                f"{mem['processes']} processes left), resume disk {resume_disk_ms:.0f} ms; "
                f"bare {b_pause:.0f}/{b_resume:.0f}/{b_ckpt:.0f}/{b_restore:.0f}+{b_exec:.0f}"
            )
    finally:
        with contextlib.suppress(Exception):
            sandbox.kill()
        bare.delete(bare_id)
    pss = [m["pss_mib"] for m in memory[1:]] or [0.0]
    procs = [m["processes"] for m in memory[1:]] or [0]
    report.memory["paused_to_disk"] = {
        "rounds": len(memory) - 1,
        "max_pss_mib": max(pss),
        "max_processes": max(procs),
    }
    disk = report.samples.get("paused_image_mib", [])
    report.sizes["paused_image_mib_p50"] = p50(disk)
    report.sizes["bare_checkpoint_exit_mib_p50"] = p50(
        report.samples.get("bare_checkpoint_exit_mib", [])
    )
    report.rows += [
        Row(
            "pause",
            "pause (API call, freeze)",
            report.lat("pause_hot"),
            report.lat("bare_pause"),
            "runsc pause",
            TARGET_PAUSE_MS,
        ),
        Row(
            "pause",
            "resume hot: Sandbox.connect() (thaw)",
            report.lat("resume_hot"),
            report.lat("bare_resume"),
            "runsc resume",
            TARGET_RESUME_MS,
        ),
        Row(
            "pause",
            "resume hot → first commands.run",
            report.lat("resume_hot_first_command"),
            plot=False,
        ),
        Row(
            "pause",
            f"pause → image on disk, after the {PAUSE_HOT_S:g} s hot period",
            report.lat("image_on_disk_after_hot_period"),
            report.lat("bare_checkpoint_exit"),
            "runsc checkpoint (exits)",
        ),
        Row(
            "pause",
            "spill as logged (checkpoint, fsync, free runtime + slot)",
            report.lat("spill_server"),
        ),
        Row(
            "pause",
            "disk per paused sandbox (image, MiB)",
            None,
            unit="MiB",
            value=p50(disk),
            note=f"bare checkpoint {report.sizes['bare_checkpoint_exit_mib_p50']} MiB",
        ),
        Row(
            "pause",
            "memory of a sandbox paused to disk, kept ready to resume (PSS MiB, max)",
            None,
            target=TARGET_PAUSED_MIB,
            unit="MiB",
            value=max(pss),
            note=f"max {max(procs)} processes naming it, over {len(pss)} rounds",
        ),
        Row(
            "pause",
            "resume from disk: Sandbox.connect() (restore)",
            report.lat("resume_disk"),
            report.lat("bare_restore_resume"),
            "restore -detach",
            TARGET_RESUME_DISK_MS,
            issue="resume from disk (connect)",
        ),
        Row(
            "pause",
            "resume from disk: Sandbox.connect() vs a pre-created bare sandbox",
            report.lat("resume_disk"),
            report.lat("bare_restore_resume_precreated"),
            "runsc create (untimed) + restore -detach",
            TARGET_RESUME_DISK_MS,
            plot=False,
            issue="resume from disk (connect)",
        ),
        Row(
            "pause",
            "resume from disk → first commands.run",
            report.lat("resume_disk_first_command"),
            report.lat("bare_restore_resume_exec"),
            "first exec true",
            plot=False,
        ),
    ]
