"""envd benchmark: command round trip, file throughput and idle memory (``make bench``).

Starts one envd in a throwaway bubblewrap root (tests/envd/harness.py) -- the built bundle at
build/envd-bundle when it exists, else the source tree -- and drives it with the official Python
SDK in debug mode, exactly as the conformance tests do. Alongside each SDK number it measures the
layers underneath, so a miss can be attributed without a profiler:

* latency: SDK ``commands.run("true")``; the same Connect ``Start`` stream sent raw with httpx
  (no SDK); ``Start`` of ``/bin/true`` (no shell) as the default user and as root (root needs no
  uid switch); the bare spawn of the same commands timed by a loop inside the sandbox; a raw
  unary ``process.Process/List`` and ``GET /health`` (the HTTP + RPC floor);
* throughput: 100 MiB up (multipart bytes, octet-stream bytes, octet-stream iterator) and down
  (bytes, stream), content verified by SHA-256 once per variant;
* memory: RSS and PSS of the envd process after start, after the latency runs and after the
  file transfers (each after a settle pause).

Writes bench/results/envd.json and prints a markdown report (copied into docs/benchmarks.md).
Client and envd share the machine's cores, as they would on a 2 vCPU sandbox host.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tests.conftest import free_port
from tests.envd.harness import DEFAULT_BUNDLE, EnvdSandbox, start_envd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "envd.json"
MIB = 1024 * 1024

#: Targets from the issue. Throughput and memory are in MiB (the conservative reading of "MB").
TARGET_ROUND_TRIP_P50_MS = 5.0
TARGET_THROUGHPUT_MIB_S = 200.0
TARGET_IDLE_RSS_MIB = 30.0

#: What the Python SDK sends for ``commands.run("true")`` (e2b-compat.md §4.3).
SDK_CMD = ("/bin/bash", ["-l", "-c", "true"])
#: Connect end-of-stream frame with no error: flags 0x02, length 2, ``{}``.
END_STREAM_OK = b"\x02\x00\x00\x00\x02{}"
#: Above this 1-minute load average before the run, warn that something else competes for CPU.
LOAD_WARN = 0.5
ROOT_AUTH = "Basic " + base64.b64encode(b"root:").decode()


# -- statistics -------------------------------------------------------------------------------


@dataclass
class Latency:
    """Latency of one operation over ``n`` timed runs (after a warm-up), in milliseconds."""

    name: str
    n: int
    p50_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float

    @classmethod
    def of(cls, name: str, samples_ms: list[float]) -> Latency:
        ordered = sorted(samples_ms)
        # Nearest-rank p95: an observed value, not an interpolation between two of them.
        p95 = ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]
        return cls(
            name,
            len(ordered),
            round(statistics.median(ordered), 3),
            round(p95, 3),
            round(statistics.fmean(ordered), 3),
            round(ordered[0], 3),
        )


@dataclass
class Throughput:
    """Transfer rate of one upload/download variant over ``runs`` transfers, MiB/s."""

    name: str
    size_mib: float
    runs: int
    p50_mib_s: float
    min_mib_s: float
    max_mib_s: float
    verified: bool
    error: str | None = None


@dataclass
class Memory:
    """envd's memory at one moment, MiB (PSS splits shared pages among their users)."""

    when: str
    pid: int
    rss_mib: float
    pss_mib: float | None
    pss_anon_mib: float | None
    peak_rss_mib: float


@dataclass
class Report:
    """Everything one run measured; serialised as-is to bench/results/envd.json."""

    meta: dict[str, Any]
    latency: list[Latency] = field(default_factory=list)
    derived: dict[str, float] = field(default_factory=dict)
    throughput: list[Throughput] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def time_interleaved(
    calls: dict[str, Callable[[], object]], runs: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time in ms of ``runs`` calls of each callable, after ``warmup`` untimed ones each.

    The callables take turns (A B C A B C ...) rather than running in blocks, so a noisy
    neighbour or a load drift on a shared 2 vCPU machine hits every variant alike and the
    differences between them (which is what the derived overheads are) stay meaningful.
    """
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples


# -- the envd process and its memory ----------------------------------------------------------


def _ppid_and_comm(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is parenthesised and may contain spaces: split around the last ')'.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return int(stat[stat.rindex(")") + 2 :].split()[1]), comm


def find_envd_pid(bwrap_pid: int) -> int:
    """envd inside the sandbox: the first non-bwrap descendant of the bwrap we started.

    bwrap with ``--unshare-pid`` forks a second bwrap that is pid 1 of the namespace; that one
    runs envd (the bundle's launcher execs the interpreter, so it keeps the pid). Processes
    envd spawns are deeper still, so breadth-first order finds envd first.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _ppid_and_comm(int(entry.name))) is not None:
            children.setdefault(info[0], []).append((int(entry.name), info[1]))
    queue = [bwrap_pid]
    while queue:
        for pid, comm in sorted(children.get(queue.pop(0), [])):
            if comm != "bwrap":
                return pid
            queue.append(pid)
    raise RuntimeError(f"no envd process under bwrap pid {bwrap_pid}")


def exec_helper_of(pid: int, bundle: Path | None) -> str | None:
    """The exec-as helper envd spawns user processes through, if any.

    With it, CPython's Popen can vfork (the helper switches user); without it, every command
    run as a non-root user costs a full fork of envd -- the biggest item in the round trip.
    """
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if b"--exec-helper" in argv:
        return argv[argv.index(b"--exec-helper") + 1].decode()
    if bundle is not None and os.access(bundle / "bin" / "exec-as", os.X_OK):
        return str(bundle / "bin" / "exec-as")  # envd's default when run from a bundle
    return None


def _kib_fields(path: Path, names: set[str]) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            values[key] = int(rest.split()[0])
    return values


def read_memory(pid: int, when: str) -> Memory:
    status = _kib_fields(Path(f"/proc/{pid}/status"), {"VmRSS", "VmHWM"})
    try:
        rollup = _kib_fields(Path(f"/proc/{pid}/smaps_rollup"), {"Pss", "Pss_Anon"})
    except OSError:  # kernels before 4.14 have no smaps_rollup
        rollup = {}

    def mib(kib: int | None) -> float | None:
        return None if kib is None else round(kib / 1024, 1)

    return Memory(
        when,
        pid,
        mib(status["VmRSS"]) or 0.0,
        mib(rollup.get("Pss")),
        mib(rollup.get("Pss_Anon")),
        mib(status["VmHWM"]) or 0.0,
    )


# -- raw Connect calls (no SDK) ---------------------------------------------------------------


def envelope(message: dict[str, Any]) -> bytes:
    """One Connect stream envelope: flags 0, big-endian length, JSON."""
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def raw_start(client: httpx.Client, cmd: str, args: list[str], *, root: bool) -> Callable[[], None]:
    """A callable that runs ``cmd`` through a raw ``Start`` stream and checks it ended cleanly.

    Sends what the SDK sends for ``commands.run`` (stdin off, 60 s Connect timeout, keepalive
    header), so the difference to the SDK number is the SDK's own client cost.
    """
    body = envelope({"process": {"cmd": cmd, "args": args, "envs": {}}, "stdin": False})
    headers = {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": "60000",
        "keepalive-ping-interval": "50",
    }
    if root:
        headers["authorization"] = ROOT_AUTH

    def call() -> None:
        response = client.post("/process.Process/Start", content=body, headers=headers)
        content = response.content
        if response.status_code != 200 or not content.endswith(END_STREAM_OK):
            raise RuntimeError(f"Start {cmd} failed: {response.status_code} {content[-200:]!r}")
        if b'"exitCode"' in content:  # proto3 JSON omits a zero exit code
            raise RuntimeError(f"Start {cmd} exited non-zero: {content[-200:]!r}")

    return call


def raw_unary_list(client: httpx.Client) -> Callable[[], None]:
    headers = {"content-type": "application/json", "connect-protocol-version": "1"}

    def call() -> None:
        response = client.post("/process.Process/List", content=b"{}", headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"List failed: {response.status_code} {response.text[:200]}")

    return call


def raw_health(client: httpx.Client) -> Callable[[], None]:
    def call() -> None:
        if (status := client.get("/health").status_code) != 204:
            raise RuntimeError(f"/health answered {status}")

    return call


# -- measurements -----------------------------------------------------------------------------


def in_sandbox_spawn_ms(sandbox: Any, command: str, count: int, repeats: int = 3) -> float:
    """Mean cost of spawning ``command`` from a shell loop inside the sandbox, in ms.

    Timed by the sandbox itself (``date +%s%N`` around the loop), so neither envd nor the SDK
    is in the measurement: this is the floor any daemon pays for running the same command.
    The median of ``repeats`` loops damps a noisy neighbour.
    """
    script = (
        f"s=$(date +%s%N); for i in $(seq {count}); do {command}; done; "
        f"e=$(date +%s%N); echo $(( (e - s) / {count} ))"
    )
    per_spawn_ns = [int(sandbox.commands.run(script).stdout.strip()) for _ in range(repeats)]
    return round(statistics.median(per_spawn_ns) / 1e6, 3)


def measure_latency(report: Report, sandbox: Any, url: str, runs: int, warmup: int) -> None:
    def sdk_run_true() -> None:
        result = sandbox.commands.run("true")
        if result.exit_code != 0:
            raise RuntimeError(f"commands.run('true') exited {result.exit_code}")

    with httpx.Client(base_url=url, timeout=60) as client:  # one keep-alive connection
        samples = time_interleaved(
            {
                'SDK commands.run("true")': sdk_run_true,
                "raw Start /bin/bash -l -c true": raw_start(client, *SDK_CMD, root=False),
                "raw Start /bin/true": raw_start(client, "/bin/true", [], root=False),
                "raw Start /bin/true as root": raw_start(client, "/bin/true", [], root=True),
                "raw unary List": raw_unary_list(client),
                "GET /health": raw_health(client),
            },
            runs,
            warmup,
        )
    report.latency = [Latency.of(name, ms) for name, ms in samples.items()]
    bash = in_sandbox_spawn_ms(sandbox, "/bin/bash -l -c true", runs)
    true = in_sandbox_spawn_ms(sandbox, "/bin/true", runs)
    p50 = {lat.name: lat.p50_ms for lat in report.latency}
    sdk = p50['SDK commands.run("true")']
    report.derived = {
        "bare_spawn_bash_login_ms": bash,
        "bare_spawn_bin_true_ms": true,
        # The question the issue asks: what does envd add on top of spawning the command?
        "envd_overhead_ms": round(sdk - bash, 3),
        # Same request, different client: the SDK's Rust HTTP stack vs httpx (can be < 0).
        "sdk_vs_httpx_client_ms": round(sdk - p50["raw Start /bin/bash -l -c true"], 3),
        "uid_switch_cost_ms": round(
            p50["raw Start /bin/true"] - p50["raw Start /bin/true as root"], 3
        ),
    }


def measure_throughput(
    report: Report, sandbox: Any, envd: EnvdSandbox, size_mib: int, runs: int
) -> None:
    """Uploads and downloads of ``size_mib`` random bytes, each variant ``runs`` times.

    Each variant is verified once (untimed) by SHA-256: uploads against the file as it landed
    on the sandbox's scratch directory, downloads against the source. The timed transfers do
    no client-side copying or hashing beyond what the SDK itself does.
    """
    data = os.urandom(size_mib * MIB)  # random: no layer can cheat by compressing
    digest = hashlib.sha256(data).hexdigest()
    chunks = [data[i : i + MIB] for i in range(0, len(data), MIB)]  # split once, untimed
    path = "/home/user/bench-transfer.bin"

    def uploaded_ok() -> bool:
        with open(envd.host_path(path), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == digest

    def read_bytes() -> object:
        return sandbox.files.read(path, format="bytes")

    def read_stream() -> object:
        for _ in sandbox.files.read(path, format="stream"):
            pass
        return None

    def read_bytes_ok() -> bool:
        return hashlib.sha256(sandbox.files.read(path, format="bytes")).hexdigest() == digest

    def read_stream_ok() -> bool:
        h = hashlib.sha256()
        for chunk in sandbox.files.read(path, format="stream"):
            h.update(chunk)
        return h.hexdigest() == digest

    def upload(fn: Callable[[], object]) -> Callable[[], bool]:
        def upload_and_check() -> bool:
            fn()
            return uploaded_ok()

        return upload_and_check

    def write_multipart() -> object:
        return sandbox.files.write(path, data)

    def write_octet() -> object:
        return sandbox.files.write(path, data, use_octet_stream=True)

    def write_iter() -> object:  # an iterable body: the SDK streams it as octet-stream
        return sandbox.files.write(path, iter(chunks))

    # name -> (timed transfer, untimed verifying transfer); uploads first so the file exists.
    variants: dict[str, tuple[Callable[[], object], Callable[[], bool]]] = {
        "upload multipart (bytes)": (write_multipart, upload(write_multipart)),
        "upload octet-stream (bytes)": (write_octet, upload(write_octet)),
        "upload octet-stream (1 MiB iterator)": (write_iter, upload(write_iter)),
        "download bytes": (read_bytes, read_bytes_ok),
        "download stream": (read_stream, read_stream_ok),
    }
    verified: dict[str, bool] = {}
    working: dict[str, Callable[[], object]] = {}
    for name, (transfer, verify) in variants.items():
        try:
            verified[name] = verify()
            working[name] = transfer
        except Exception as exc:  # an unfinished /files: report it, measure the rest
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            report.throughput.append(Throughput(name, size_mib, 0, 0, 0, 0, False, error))
            report.errors.append(f"{name}: {error}")
            if name.startswith("upload") and not envd.host_path(path).exists():
                envd.host_path(path).parent.mkdir(parents=True, exist_ok=True)
                envd.host_path(path).write_bytes(data)  # downloads need the file regardless
    for name, ms in time_interleaved(working, runs, warmup=0).items():
        rates = [size_mib / (t / 1000) for t in ms]
        report.throughput.append(
            Throughput(
                name,
                size_mib,
                runs,
                round(statistics.median(rates), 1),
                round(min(rates), 1),
                round(max(rates), 1),
                verified[name],
            )
        )
    order = list(variants)
    report.throughput.sort(key=lambda t: order.index(t.name))
    try:
        sandbox.files.remove(path)
    except Exception:
        envd.host_path(path).unlink(missing_ok=True)


# -- targets and output -----------------------------------------------------------------------


def evaluate_targets(report: Report) -> None:
    def target(name: str, measured: float | None, limit: float, higher_is_better: bool) -> None:
        ok = measured is not None and (measured >= limit if higher_is_better else measured <= limit)
        sign = ">=" if higher_is_better else "<="
        report.targets.append(
            {"name": name, "measured": measured, "target": f"{sign} {limit:g}", "pass": ok}
        )

    if report.latency:
        target("round trip p50 (ms)", report.latency[0].p50_ms, TARGET_ROUND_TRIP_P50_MS, False)
    for t in report.throughput:
        target(
            f"{t.name} p50 (MiB/s)",
            t.p50_mib_s if not t.error else None,
            TARGET_THROUGHPUT_MIB_S,
            True,
        )
    if report.memory:
        target(
            "idle envd RSS after start (MiB)", report.memory[0].rss_mib, TARGET_IDLE_RSS_MIB, False
        )


def _mark(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def markdown(report: Report) -> str:
    meta = report.meta
    targets = {t["name"]: t for t in report.targets}
    lines = [
        f"envd: **{meta['envd']['kind']}** (`{meta['envd']['path']}`, exec-as helper: "
        f"{'yes' if meta['envd'].get('exec_helper') else 'no'}); "
        f"{meta['machine']['description']}; {meta['date']}; "
        f"client: e2b {meta['sdk']} (Python {meta['python']}), same machine. "
        f"envd start to healthy: {meta['envd_start_to_healthy_ms']} ms. "
        f"Load average before/after: {meta['loadavg_before'][0]}/{meta['loadavg_after'][0]}.",
        "",
        f"| Latency ({report.latency[0].n if report.latency else 0} runs after "
        f"{meta['warmup']} warm-up) | p50 ms | p95 ms | mean ms | target | |",
        "|---|---:|---:|---:|---|---|",
    ]
    for lat in report.latency:
        row = f"| {lat.name} | {lat.p50_ms:.2f} | {lat.p95_ms:.2f} | {lat.mean_ms:.2f} |"
        if lat is report.latency[0]:
            t = targets["round trip p50 (ms)"]
            row += f" {t['target']} | {_mark(t['pass'])} |"
        else:
            row += " | |"
        lines.append(row)
    d = report.derived
    if d:
        lines += [
            f"| bare spawn `/bin/bash -l -c true` (loop in the sandbox) | "
            f"{d['bare_spawn_bash_login_ms']:.2f} | | | | |",
            f"| bare spawn `/bin/true` (loop in the sandbox) | "
            f"{d['bare_spawn_bin_true_ms']:.2f} | | | | |",
            f"| **envd overhead** = SDK round trip p50 - bare bash spawn | "
            f"**{d['envd_overhead_ms']:.2f}** | | | | |",
            f"| of which: uid switch (raw Start `/bin/true`: user p50 - root p50) | "
            f"{d['uid_switch_cost_ms']:.2f} | | | | |",
            f"| client difference: SDK p50 - raw httpx Start p50 (same request) | "
            f"{d['sdk_vs_httpx_client_ms']:.2f} | | | | |",
        ]
    if report.throughput:
        size = report.throughput[0].size_mib
        lines += [
            "",
            f"| Throughput ({size:g} MiB random, SHA-256 checked) | p50 MiB/s | min | max "
            "| target | |",
            "|---|---:|---:|---:|---|---|",
        ]
        for tp in report.throughput:
            if tp.error:
                lines.append(f"| {tp.name} | error: {tp.error[:80]} | | | | **miss** |")
                continue
            tgt = targets[f"{tp.name} p50 (MiB/s)"]
            check = "" if tp.verified else " (content MISMATCH)"
            lines.append(
                f"| {tp.name}{check} | {tp.p50_mib_s:.0f} | {tp.min_mib_s:.0f} "
                f"| {tp.max_mib_s:.0f} | {tgt['target']} | {_mark(tgt['pass'])} |"
            )
    if report.memory:
        lines += [
            "",
            "| envd memory | RSS MiB | PSS MiB | PSS anon MiB | peak RSS MiB | target | |",
            "|---|---:|---:|---:|---:|---|---|",
        ]
        for m in report.memory:
            row = f"| {m.when} | {m.rss_mib} | {m.pss_mib} | {m.pss_anon_mib} | {m.peak_rss_mib} |"
            if m is report.memory[0]:
                t = targets["idle envd RSS after start (MiB)"]
                row += f" RSS {t['target']} | {_mark(t['pass'])} |"
            else:
                row += " | |"
            lines.append(row)
    if report.errors:
        lines += ["", "Errors:", *[f"- {e}" for e in report.errors]]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the numbers were measured on (they only compare within one machine)."""
    os_name = "Linux"
    with open("/etc/os-release") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
        platform.machine(),
    )
    # Process creation and page faults cost much more under a hypervisor: worth stating.
    virtual = any(line.startswith("flags") and " hypervisor" in line for line in cpuinfo)
    mem_kib = _kib_fields(Path("/proc/meminfo"), {"MemTotal"})["MemTotal"]
    cpus = os.cpu_count() or 0
    return {
        "description": (
            f"{cpus} vCPU {cpu}{' (VM)' if virtual else ''}, {os_name}, "
            f"kernel {platform.release()}, {round(mem_kib / MIB)} GiB RAM"
        ),
        "cpus": cpus,
        "cpu_model": cpu,
        "virtual": virtual,
        "os": os_name,
        "kernel": platform.release(),
        "mem_gib": round(mem_kib / MIB, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="timed round trips per latency row")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--file-mib", type=int, default=100)
    parser.add_argument("--file-runs", type=int, default=5)
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds to let envd settle before each memory reading",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--bundle", type=Path, help=f"envd bundle (default: {DEFAULT_BUNDLE})")
    which.add_argument("--source", action="store_true", help="run envd from the source tree")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    bundle = args.bundle
    if bundle is None and not args.source and (DEFAULT_BUNDLE / "bin" / "envd").exists():
        bundle = DEFAULT_BUNDLE
    kind = "bundle" if bundle else "source tree"
    where = str(bundle) if bundle else "python -m aenv.envd (.venv)"
    print(f"envd under test: {kind} ({where})", file=sys.stderr)
    if bundle is None and not args.source:
        print(f"  ({DEFAULT_BUNDLE} not built: falling back to the source tree)", file=sys.stderr)

    import e2b  # after argparse: --help should not pay for the SDK import
    from e2b import Sandbox

    load_before = os.getloadavg()
    if load_before[0] > LOAD_WARN:
        print(
            f"warning: 1-minute load average is {load_before[0]:.2f} on {os.cpu_count()} CPUs; "
            "something else is running and the numbers will be noisy",
            file=sys.stderr,
        )
    started = time.perf_counter()
    envd = start_envd(free_port(), bundle=bundle)
    # bwrap setup + interpreter start + imports + first /health answer (polled every 50 ms).
    start_ms = round((time.perf_counter() - started) * 1000)
    report = Report(
        meta={
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "envd": {"kind": kind, "path": where},
            "machine": machine(),
            "python": platform.python_version(),
            "sdk": getattr(e2b, "__version__", None) or _dist_version("e2b"),
            "runs": args.runs,
            "warmup": args.warmup,
            "file_mib": args.file_mib,
            "file_runs": args.file_runs,
            "envd_start_to_healthy_ms": start_ms,
            "loadavg_before": [round(x, 2) for x in load_before],
        }
    )
    try:
        pid = find_envd_pid(envd.process.pid)
        report.meta["envd"]["exec_helper"] = exec_helper_of(pid, bundle)
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after start"))
        # The SDK reads these when a Sandbox is created; debug mode = no control plane.
        os.environ["E2B_DEBUG"] = "true"
        os.environ["E2B_SANDBOX_URL"] = envd.url
        sandbox = Sandbox.create()
        print("measuring latency ...", file=sys.stderr)
        measure_latency(report, sandbox, envd.url, args.runs, args.warmup)
        # Separates growth from ~1500 RPCs (leaks, caches) from growth due to 100 MiB buffers.
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after the latency runs"))
        print("measuring throughput ...", file=sys.stderr)
        measure_throughput(report, sandbox, envd, args.file_mib, args.file_runs)
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after the file transfers"))
    finally:
        envd.stop()
        if "Traceback" in envd.log():
            report.errors.append("envd log has tracebacks:\n" + envd.log()[-2000:])
    report.meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    evaluate_targets(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=2) + "\n")
    print(markdown(report))
    print(f"\nresults: {args.out}", file=sys.stderr)
    # Missed targets are findings, not failures; broken transfers or envd errors are failures.
    unverified = [t.name for t in report.throughput if not t.error and not t.verified]
    return 1 if report.errors or unverified else 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
