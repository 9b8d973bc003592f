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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tests.conftest import free_port
from tests.server.harness import (
    BUNDLE,
    NodeServer,
    cleanup_home,
    client_env,
    start_server,
)

from aenv.core.net import GUEST_IP, NetSlot
from aenv.core.settings import Settings
from aenv.runtime import oci
from aenv.runtime.base import ENVD_PORT, SandboxSpec
from aenv.runtime.runsc import RUNSC, RunscConfig
from bench.envd_bench import (
    END_STREAM_OK,
    LOAD_WARN,
    SDK_CMD,
    Latency,
    envelope,
    in_sandbox_spawn_ms,
    machine,
    raw_health,
    raw_start,
    time_interleaved,
)

#: Bare sandboxes run on the node's default platform, as its own do.
NODE_PLATFORM = str(Settings.model_fields["runsc_platform"].default)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "node.json"
MIB = 1024 * 1024

#: Targets from the issue.
TARGET_CREATE_RATIO = 1.5  # create → first command, over the bare runsc baseline
TARGET_ROUND_TRIP_P50_MS = 10.0
TARGET_IDLE_PSS_MIB = 60.0  # per idle sandbox, envd included
#: The SDK gives up on a request after 60 s; N concurrent cold creates on 2 busy cores can take
#: about that long, and the point is to see when all of them are done.
CONCURRENT_REQUEST_TIMEOUT_S = 600.0

#: Network slot range of this benchmark's nodes (disjoint from other users of the machine);
#: the cold and the warm node split it.
NET_FIRST, NET_LAST = 50000, 50999
#: Host cgroup parent of the node's sandboxes (``GvisorConfig.cgroup_parent``) and ours.
NODE_CGROUP = "aenv"
BARE_CGROUP = "aenv-bench"
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The server's per-create log line (orchestrator): total and ``name ms`` phases.
CREATED_RE = re.compile(
    r"created (?P<id>[a-z0-9]{20})(?: \((?P<kind>warm|cold)\))? in (?P<total>\d+) ms"
    r"\W*(?P<phases>.*)$"
)
PHASE_RE = re.compile(r"([a-z_]+) (\d+)")
WARM_READY_RE = re.compile(r"warm sandbox [a-z0-9]{20} ready")
WARM_TAKEN_RE = re.compile(r"created [a-z0-9]{20} \(warm\)")
#: Server log lines kept in the results (per node, filled when it stops).
KEEP_LOG_RE = re.compile(r"created |booted |warm sandbox|WARNING|ERROR|Traceback|recovered")
SERVER_LOG_LINES: dict[str, list[str]] = {}


# -- results ----------------------------------------------------------------------------------


@dataclass
class CreateSample:
    """One timed create → first command, with the server's phase breakdown if it logs one."""

    variant: str
    sandbox_id: str
    create_ms: float
    first_command_ms: float
    total_ms: float
    #: CPU of the sandbox's cgroup (sentry, gofer, envd...) when the first command answered:
    #: everything since the boot, which for a warm sandbox happened before the create.
    sandbox_cpu_ms: float | None = None
    #: CPU of the server process and its reaped children (runsc, mount, ip) during the create.
    server_cpu_ms: float | None = None
    server_phases_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class BareSample:
    """One bare ``runsc run -detach`` + first ``runsc exec true``."""

    run_ms: float
    exec_ms: float
    total_ms: float
    #: CPU of the sandbox's cgroup after the exec answered.
    sandbox_cpu_ms: float | None = None


@dataclass
class SandboxMemory:
    """Memory of one idle sandbox: host processes (PSS, MiB) and cross-checks."""

    sandbox_id: str
    processes: int
    pss_mib: float
    pss_anon_mib: float
    pss_file_mib: float
    pss_shmem_mib: float
    by_kind_mib: dict[str, float]
    cgroup_usage_mib: float | None
    cgroup_stat_mib: dict[str, float]
    envd_guest_rss_mib: float | None


@dataclass
class Report:
    """Everything one run measured; serialised as-is to bench/results/node.json."""

    meta: dict[str, Any]
    create: dict[str, list[Latency]] = field(default_factory=dict)
    create_samples: list[CreateSample] = field(default_factory=list)
    bare: list[Latency] = field(default_factory=list)
    bare_samples: list[BareSample] = field(default_factory=list)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    round_trip: list[Latency] = field(default_factory=list)
    derived: dict[str, float] = field(default_factory=dict)
    concurrent: dict[str, Any] = field(default_factory=dict)
    memory: list[SandboxMemory] = field(default_factory=list)
    memory_summary: dict[str, float] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def ms_since(start: float) -> float:
    """Milliseconds since ``start`` (a ``time.perf_counter()`` value)."""
    return (time.perf_counter() - start) * 1000


def p50(samples: list[float]) -> float:
    """Median, rounded to µs."""
    return round(statistics.median(samples), 3)


# -- nodes ------------------------------------------------------------------------------------


def server_has_setting(name: str) -> bool:
    """Whether this server version knows ``AENV_<NAME>`` (features land while we measure)."""
    return name in Settings.model_fields


@dataclass
class Node:
    """One node server under test and how to reach it with the SDK."""

    name: str
    server: NodeServer
    warm_pool: int
    #: Its network slot range (a recovery restart must sweep only this one).
    net_range: tuple[int, int]

    def sdk_opts(self) -> dict[str, Any]:
        env = client_env(self.server)
        return {
            "api_key": env["E2B_API_KEY"],
            "api_url": env["E2B_API_URL"],
            "sandbox_url": env["E2B_SANDBOX_URL"],
            "domain": env["E2B_DOMAIN"],
        }

    def create(self, **kwargs: Any) -> Any:
        from e2b import Sandbox

        return Sandbox.create(timeout=600, **self.sdk_opts(), **kwargs)

    def kill_all(self) -> None:
        """Kill every sandbox the node lists (what a test session does at its end)."""
        from e2b import Sandbox

        paginator = Sandbox.list(**self.sdk_opts())
        ids: list[str] = []
        while paginator.has_next:
            ids += [info.sandbox_id for info in paginator.next_items()]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda sid: Sandbox.kill(sid, **self.sdk_opts()), ids))

    def created_lines(self) -> dict[str, dict[str, Any]]:
        """Parsed ``created …`` log lines by sandbox id."""
        found: dict[str, dict[str, Any]] = {}
        for line in self.server.log().splitlines():
            if m := CREATED_RE.search(line):
                phases = {k: float(v) for k, v in PHASE_RE.findall(m["phases"])}
                found[m["id"]] = {"server_total": float(m["total"]), **phases}
        return found

    def wait_pool_full(self, timeout: float = 120.0) -> bool:
        """Wait until the warm pool holds ``warm_pool`` sandboxes again (from the log)."""
        if self.warm_pool <= 0:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.server.log()
            if len(WARM_READY_RE.findall(log)) - len(WARM_TAKEN_RE.findall(log)) >= self.warm_pool:
                return True
            time.sleep(0.1)
        return False

    def slot_ifname(self, sandbox_id: str) -> str | None:
        """The host veth of a sandbox's network slot, from the node's store (read-only)."""
        db = self.server.home / "state.db"
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                row = conn.execute(
                    "SELECT instance FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
                ).fetchone()
        except sqlite3.Error:
            return None
        if not row or not row[0]:
            return None
        slot = json.loads(row[0]).get("slot") or {}
        name = slot.get("host_ifname")
        return str(name) if name else None


def start_node(name: str, first: int, last: int, **settings: str) -> Node:
    """A node server on slots ``first..last`` with extra ``AENV_*`` settings, once healthy."""
    started = time.perf_counter()
    server = start_server(
        free_port(), None, net_first_index=str(first), net_last_index=str(last), **settings
    )
    print(f"{name} node on {server.url} up in {ms_since(started):.0f} ms", file=sys.stderr)
    pool = int(settings.get("warm_pool_size", "0"))
    if server_has_setting("warm_pool_size") and "warm_pool_size" not in settings:
        pool = int(Settings.model_fields["warm_pool_size"].default)
    return Node(name, server, pool, (first, last))


def leftovers(home: Path) -> bool:
    """Whether anything of a stopped node still runs or is mounted (its sandboxes survive a
    server stop by design; warm ones have no record)."""
    needle = str(home)
    if needle in Path("/proc/self/mountinfo").read_text():
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle.encode() in (entry / "cmdline").read_bytes():
                    return True
    return False


def stop_node(node: Node, errors: list[str]) -> None:
    """Kill its sandboxes, stop it, and make sure nothing of it is left before removing its
    home: a restart on the same home runs the node's own recovery (destroys orphans, sweeps
    stale network slots), which is the only safe way to clean up after it."""
    server = node.server
    try:
        node.kill_all()
    except Exception as exc:
        errors.append(f"{node.name}: killing sandboxes failed: {exc!r}")
    server.stop()
    # Kept in the results: the phase lines are the first place to look at a miss.
    SERVER_LOG_LINES[node.name] = [
        line for line in server.log().splitlines() if KEEP_LOG_RE.search(line)
    ][-2000:]
    if "Traceback" in server.log():
        errors.append(f"{node.name} node log has tracebacks:\n" + server.log()[-3000:])
    if leftovers(server.home):
        print(f"{node.name}: leftovers after stop, running recovery", file=sys.stderr)
        again = start_server(
            free_port(),
            home=server.home,
            net_first_index=str(node.net_range[0]),
            net_last_index=str(node.net_range[1]),
            **_quiet_settings(),
        )
        again.stop()
    if leftovers(server.home):
        errors.append(f"{node.name}: sandboxes or mounts of {server.home} remain")
        return
    remove_home(server.home)


def remove_home(home: Path, patience_s: float = 15.0) -> None:
    """``cleanup_home``, retried: right after a teardown a dying gofer (reaped late by this
    machine's PID 1) can still hold a rootfs mount in its own namespace, so ``rmdir`` fails
    with EBUSY for a moment."""
    deadline = time.monotonic() + patience_s
    cleanup_home(home)
    while home.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
        cleanup_home(home)


def sweep_slots(first: int, last: int, errors: list[str]) -> None:
    """Remove network slots of our range that stopped nodes left prepared (their pools),
    through a node's own start-up sweep: a node that boots nothing, started and stopped."""
    netns = Path("/run/netns")
    names = {p.name for p in netns.iterdir()} if netns.is_dir() else set()
    if not any(f"aenv-{i}" in names for i in range(first, last + 1)):
        return
    try:
        server = start_server(
            free_port(),
            None,
            net_first_index=str(first),
            net_last_index=str(last),
            **_quiet_settings(),
        )
    except Exception as exc:
        errors.append(f"sweeping network slots {first}-{last} failed: {exc!r}")
        return
    server.stop()
    remove_home(server.home)


def _quiet_settings() -> dict[str, str]:
    """Settings for a node that boots nothing by itself."""
    out = {"net_pool_size": "0"}
    if server_has_setting("warm_pool_size"):
        out["warm_pool_size"] = "0"
    return out


# -- bare runsc baseline ----------------------------------------------------------------------


class BareRunsc:
    """``runsc run -detach`` of a bundle equivalent to a node sandbox's, and ``exec``.

    The bundle is the node's own ``oci.sandbox_config`` for the same CPU/memory (so the same
    mounts, capabilities, rlimits and cgroup resources), with three differences: the root is
    an overlay of the template's layer with a throwaway upper (runsc creates mount points in
    its root even when that is read-only, and a shared layer must never change), init is
    ``/bin/sleep 1000`` (the node's is envd) and there is no network (``--network=none``; the
    node gives runsc a pooled netns with a veth and runs it through an ``unshare`` wrapper).
    The runsc flags are the node's (``RunscConfig.global_flags``) with our own ``--root``.
    """

    def __init__(self, rootfs: Path, cpu_count: int, memory_mb: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nb-", dir="/tmp"))  # short: socket paths
        for name in ("upper", "work", "merged"):
            (self.dir / name).mkdir()
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={rootfs},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
             str(self.dir / "merged")],
            check=True,
        )
        self.rootfs = self.dir / "merged"
        self.cpu_count = cpu_count
        self.memory_mb = memory_mb
        self.flags = RunscConfig(root=self.dir / "root", network="none",
                                 platform=NODE_PLATFORM).global_flags()
        self.count = 0

    def _config(self, cid: str) -> dict[str, Any]:
        spec = SandboxSpec(
            sandbox_id=cid,
            rootfs=self.rootfs,
            envd_bundle=BUNDLE,
            cpu_count=self.cpu_count,
            memory_mb=self.memory_mb,
        )
        slot = NetSlot(0, "none", "/nonexistent", "none", "none")
        config = oci.sandbox_config(spec, slot, cgroups_path=f"/{BARE_CGROUP}/{cid}")
        config["process"]["args"] = ["/bin/sleep", "1000"]
        config["mounts"] = [
            m for m in config["mounts"] if m["destination"] not in ("/opt/aenv/envd", oci.SUDO_PATH)
        ]
        config["linux"]["namespaces"] = [
            ns for ns in config["linux"]["namespaces"] if ns["type"] != "network"
        ]
        return config

    def _runsc(self, *args: str, check: bool = True) -> float:
        """Run runsc to completion; wall ms. No ``timeout=``: Popen would poll in 50 ms
        sleeps and round the timing up (RUNTIME-NOTES)."""
        with open(self.dir / "runsc.err", "ab") as err:
            start = time.perf_counter()
            done = subprocess.run(
                [str(RUNSC), *self.flags, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                check=False,
            )
            elapsed = ms_since(start)
        if check and done.returncode != 0:
            tail = (self.dir / "runsc.err").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"runsc {args[0]} failed ({done.returncode}): {tail}")
        return elapsed

    def once(self) -> BareSample:
        """One sandbox: run -detach, first exec answered (timed), then delete (untimed)."""
        cid = f"nbench-{self.count:06d}"  # fixed length: runsc matches ids by prefix
        self.count += 1
        bundle = self.dir / cid
        bundle.mkdir()
        oci.write_config(bundle, self._config(cid))
        try:
            run_ms = self._runsc("run", "-detach", f"-bundle={bundle}", cid)
            exec_ms = self._runsc("exec", cid, "/bin/true")
            return BareSample(
                round(run_ms, 3),
                round(exec_ms, 3),
                round(run_ms + exec_ms, 3),
                cgroup_cpu_ms(f"{BARE_CGROUP}/{cid}"),
            )
        finally:
            self._runsc("delete", "--force", cid, check=False)
            _remove_cgroups(f"{BARE_CGROUP}/{cid}")
            for path in sorted(bundle.rglob("*"), reverse=True):
                path.unlink() if not path.is_dir() else path.rmdir()
            bundle.rmdir()

    def close(self) -> None:
        _remove_cgroups(BARE_CGROUP)
        subprocess.run(["umount", "-l", str(self.dir / "merged")], check=False)
        for path in sorted(self.dir.rglob("*"), reverse=True):
            with contextlib.suppress(OSError):
                path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        with contextlib.suppress(OSError):
            self.dir.rmdir()


def _remove_cgroups(relative: str) -> None:
    for controller in CGROUP_ROOT.iterdir():
        path = controller / relative
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()


def template_rootfs(node: Node, sandbox_id: str) -> Path:
    """The read-only layer a node sandbox's overlay sits on (the base template has one)."""
    record = json.loads((node.server.home / "sandboxes" / sandbox_id / "rootfs.json").read_text())
    lowers = record.get("lowers", record) if isinstance(record, dict) else record
    if not isinstance(lowers, list) or len(lowers) != 1:
        raise RuntimeError(f"expected one lower layer, found {lowers!r}")
    return Path(lowers[0])


# -- 1 + 2: create → first command, interleaved with the bare baseline ------------------------


def cgroup_cpu_ms(relative: str) -> float | None:
    """CPU time of a host cgroup (cpuacct, v1), ms."""
    try:
        return round(
            int((CGROUP_ROOT / "cpuacct" / relative / "cpuacct.usage").read_text()) / 1e6, 1
        )
    except (OSError, ValueError):
        return None


def process_cpu_ms(pid: int) -> float:
    """utime + stime of ``pid`` and of its reaped children, ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def timed_create(node: Node) -> tuple[Any, CreateSample]:
    server_cpu = process_cpu_ms(node.server.process.pid)
    start = time.perf_counter()
    sandbox = node.create()
    create_ms = ms_since(start)
    mid = time.perf_counter()
    result = sandbox.commands.run("true")
    first_ms = ms_since(mid)
    if result.exit_code != 0:
        raise RuntimeError(f"first command exited {result.exit_code}")
    return sandbox, CreateSample(
        node.name,
        sandbox.sandbox_id,
        round(create_ms, 3),
        round(first_ms, 3),
        round(create_ms + first_ms, 3),
        cgroup_cpu_ms(f"{NODE_CGROUP}/{sandbox.sandbox_id}"),
        round(process_cpu_ms(node.server.process.pid) - server_cpu, 1),
    )


def measure_create(report: Report, nodes: list[Node], bare: BareRunsc, runs: int) -> None:
    """``runs`` rounds of: cold create, bare runsc, warm create (each timed alone, with
    every warm pool full and nothing booting in the background), then untimed cleanup."""
    for i in range(runs + 1):  # round 0 is a warm-up
        for node in nodes:
            if not node.wait_pool_full():
                report.errors.append(f"{node.name}: warm pool not refilled within 120 s")
        samples: list[CreateSample] = []
        sandboxes: list[tuple[Node, Any]] = []
        bare_sample = None
        try:
            for node in nodes:
                sandbox, sample = timed_create(node)
                sandboxes.append((node, sandbox))
                samples.append(sample)
                if node is nodes[0]:
                    bare_sample = bare.once()
        finally:
            for _, sandbox in sandboxes:
                sandbox.kill()
        if i == 0:
            continue
        report.create_samples += samples
        if bare_sample is not None:
            report.bare_samples.append(bare_sample)
        print(
            f"  round {i}/{runs}: "
            + ", ".join(f"{s.variant} {s.create_ms:.0f}+{s.first_command_ms:.0f}" for s in samples)
            + (f", bare {bare_sample.run_ms:.0f}+{bare_sample.exec_ms:.0f}" if bare_sample else "")
            + " ms",
            file=sys.stderr,
        )
    for node in nodes:
        lines = node.created_lines()
        for s in report.create_samples:
            if s.variant == node.name and s.sandbox_id in lines:
                s.server_phases_ms = lines[s.sandbox_id]
    for node in nodes:
        mine = [s for s in report.create_samples if s.variant == node.name]
        report.create[node.name] = [
            Latency.of(f"{node.name}: Sandbox.create()", [s.create_ms for s in mine]),
            Latency.of(
                f'{node.name}: first commands.run("true")', [s.first_command_ms for s in mine]
            ),
            Latency.of(f"{node.name}: create → first command", [s.total_ms for s in mine]),
        ]
        phase_names: list[str] = []
        for s in mine:
            phase_names += [k for k in s.server_phases_ms if k not in phase_names]
        report.phases[node.name] = {
            k: p50([s.server_phases_ms[k] for s in mine if k in s.server_phases_ms])
            for k in phase_names
        }
        for key in ("sandbox_cpu_ms", "server_cpu_ms"):
            values = [v for s in mine if (v := getattr(s, key)) is not None]
            if values:
                report.phases[node.name][key] = p50(values)
    bare_cpu = [b.sandbox_cpu_ms for b in report.bare_samples if b.sandbox_cpu_ms is not None]
    if bare_cpu:
        report.phases["bare"] = {"sandbox_cpu_ms": p50(bare_cpu)}
    report.bare = [
        Latency.of("bare: runsc run -detach", [b.run_ms for b in report.bare_samples]),
        Latency.of("bare: first runsc exec true", [b.exec_ms for b in report.bare_samples]),
        Latency.of("bare: run → first exec answered", [b.total_ms for b in report.bare_samples]),
    ]


# -- 3: round trips ---------------------------------------------------------------------------


class GuestConnection(http.client.HTTPConnection):
    """HTTP/1.1 straight to a sandbox's envd, no proxy: the socket is bound to the slot's host
    veth before it connects (every guest has the same address; aenv.network.guest_http)."""

    def __init__(self, ifname: str) -> None:
        super().__init__(GUEST_IP, ENVD_PORT, timeout=60)
        self.ifname = ifname

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock

    def call(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> bytes:
        self.request(method, path, body=body, headers=headers)
        response = self.getresponse()
        data = response.read()
        if response.status not in (200, 204):
            raise RuntimeError(f"direct {method} {path}: {response.status} {data[-200:]!r}")
        return data


def direct_start(
    conn: GuestConnection, token: str, cmd: str, args: list[str]
) -> Callable[[], None]:
    body = envelope({"process": {"cmd": cmd, "args": args, "envs": {}}, "stdin": False})
    headers = {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": "60000",
        "keepalive-ping-interval": "50",
        "X-Access-Token": token,
    }

    def call() -> None:
        if not conn.call("POST", "/process.Process/Start", body, headers).endswith(END_STREAM_OK):
            raise RuntimeError("direct Start did not end cleanly")

    return call


def measure_round_trip(report: Report, node: Node, runs: int, warmup: int, loop: int) -> None:
    """Round trips of one sandbox, through the proxy and straight to the guest (interleaved),
    then the bare spawn costs timed inside the sandbox."""
    sandbox = node.create()
    try:
        token = sandbox._envd_access_token
        proxy_headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            **({"X-Access-Token": token} if token else {}),
        }

        def sdk_run_true() -> None:
            if (code := sandbox.commands.run("true").exit_code) != 0:
                raise RuntimeError(f"commands.run('true') exited {code}")

        def node_health(client: httpx.Client) -> Callable[[], None]:
            def call() -> None:
                if (status := client.get("/health").status_code) != 200:
                    raise RuntimeError(f"node /health answered {status}")

            return call

        calls: dict[str, Callable[[], object]] = {}
        with (
            httpx.Client(base_url=node.server.url, headers=proxy_headers, timeout=60) as proxy,
            httpx.Client(base_url=node.server.url, timeout=60) as plain,
        ):
            calls['SDK commands.run("true") (proxy)'] = sdk_run_true
            calls["raw Start /bin/bash -l -c true (proxy)"] = raw_start(proxy, *SDK_CMD, root=False)
            ifname = node.slot_ifname(sandbox.sandbox_id)
            conn = GuestConnection(ifname) if ifname else None
            if conn is not None and token:
                calls["raw Start /bin/bash -l -c true (direct)"] = direct_start(
                    conn, token, SDK_CMD[0], SDK_CMD[1]
                )
            else:
                report.errors.append("no slot found for the direct-to-guest rows")
            calls["raw Start /bin/true (proxy)"] = raw_start(proxy, "/bin/true", [], root=False)
            calls["GET /health (proxy)"] = raw_health(proxy)
            if conn is not None:
                calls["GET /health (direct)"] = lambda: conn.call("GET", "/health", None, {})
            calls["GET /health of the node (no proxy)"] = node_health(plain)
            samples = time_interleaved(calls, runs, warmup)
            if conn is not None:
                conn.close()
        report.round_trip = [Latency.of(name, ms) for name, ms in samples.items()]
        bash = in_sandbox_spawn_ms(sandbox, "/bin/bash -l -c true", loop)
        true = in_sandbox_spawn_ms(sandbox, "/bin/true", loop)
    finally:
        sandbox.kill()
    med = {lat.name: lat.p50_ms for lat in report.round_trip}
    sdk = med['SDK commands.run("true") (proxy)']
    report.derived = {
        "bare_spawn_bash_login_ms": bash,
        "bare_spawn_bin_true_ms": true,
        "overhead_over_bare_bash_ms": round(sdk - bash, 3),
        "proxy_health_minus_direct_ms": round(
            med["GET /health (proxy)"] - med.get("GET /health (direct)", float("nan")), 3
        ),
        "proxy_start_minus_direct_ms": round(
            med["raw Start /bin/bash -l -c true (proxy)"]
            - med.get("raw Start /bin/bash -l -c true (direct)", float("nan")),
            3,
        ),
        "sdk_minus_httpx_ms": round(sdk - med["raw Start /bin/bash -l -c true (proxy)"], 3),
    }


# -- 4: concurrent creates --------------------------------------------------------------------


def measure_concurrent(report: Report, node: Node, count: int) -> None:
    """``count`` creates released at once, each followed by a command; wall time, per-create
    latency, the server's phases and the CPU they took."""
    barrier = threading.Barrier(count)
    sandboxes: list[Any] = []
    lock = threading.Lock()

    def one(_: int) -> tuple[float, float, float]:
        barrier.wait()
        start = time.perf_counter()
        sandbox = node.create(request_timeout=CONCURRENT_REQUEST_TIMEOUT_S)
        with lock:
            sandboxes.append(sandbox)
        create_ms = ms_since(start)
        if (code := sandbox.commands.run("true").exit_code) != 0:
            raise RuntimeError(f"first command exited {code}")
        return start, create_ms, time.perf_counter()

    load = os.getloadavg()[0]
    results: list[tuple[float, float, float]] = []
    failures: list[str] = []
    server_cpu = process_cpu_ms(node.server.process.pid)
    sandbox_cpu: list[float] = []
    try:
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(one, i) for i in range(count)]
            for future in futures:
                try:
                    results.append(future.result())
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        server_cpu = process_cpu_ms(node.server.process.pid) - server_cpu
        for sandbox in sandboxes:
            if (cpu := cgroup_cpu_ms(f"{NODE_CGROUP}/{sandbox.sandbox_id}")) is not None:
                sandbox_cpu.append(cpu)
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.kill(), sandboxes))
    report.errors += [f"concurrent create: {f}" for f in failures]
    if not results:
        return
    wall_ms = (max(r[2] for r in results) - min(r[0] for r in results)) * 1000
    lines = node.created_lines()
    mine = [lines[s.sandbox_id] for s in sandboxes if s.sandbox_id in lines]
    names = list(dict.fromkeys(k for phases in mine for k in phases))
    report.concurrent = {
        "count": count,
        "succeeded": len(results),
        "wall_ms": round(wall_ms, 1),
        "loadavg_before": round(load, 2),
        "server_cpu_ms": round(server_cpu, 1),
        "sandbox_cpu_ms_p50": p50(sandbox_cpu) if sandbox_cpu else None,
        "cpu_per_create_ms": round((sum(sandbox_cpu) + server_cpu) / len(sandbox_cpu), 1)
        if sandbox_cpu
        else None,
        "create": asdict(Latency.of("create", [r[1] for r in results])),
        "create_to_first_command": asdict(
            Latency.of("create → first command", [(r[2] - r[0]) * 1000 for r in results])
        ),
        "server_phases_p50_ms": {k: p50([m[k] for m in mine if k in m]) for k in names},
        "server_phases_max_ms": {k: max(m[k] for m in mine if k in m) for k in names},
    }


# -- 5: memory --------------------------------------------------------------------------------


def _kib(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    values = dict.fromkeys(names, 0)
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in values:
            values[key] = int(rest.split()[0])
    return values


def sandbox_pids(sandbox_id: str, cgroup_parent: str = NODE_CGROUP) -> set[int]:
    """Host processes of one sandbox: its cgroup in every v1 controller, plus any process
    whose command line names it (the runsc CLI, the gofer, the sandbox process; the systrap
    stubs are in the cgroup)."""
    pids: set[int] = set()
    for controller in CGROUP_ROOT.iterdir():
        procs = controller / cgroup_parent / sandbox_id / "cgroup.procs"
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in procs.read_text().split())
    needle = sandbox_id.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
    return pids


def process_kind(pid: int) -> str:
    """runsc-sandbox (the sentry), runsc-gofer, systrap stubs (no command line) or argv[0]."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return "gone"
    if argv0 in ("runsc-sandbox", "runsc-gofer"):
        return argv0
    return "systrap stubs" if not argv0 else Path(argv0).name


def sandbox_memory(sandbox_id: str) -> SandboxMemory:
    """Host-side memory of one sandbox: PSS of its processes and its memory cgroup."""
    total = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0}
    by_kind: dict[str, float] = {}
    pids = sandbox_pids(sandbox_id)
    for pid in sorted(pids):
        try:
            rollup = _kib(Path(f"/proc/{pid}/smaps_rollup"), tuple(total))
        except OSError:
            continue
        for key in total:
            total[key] += rollup[key]
        kind = process_kind(pid)
        by_kind[kind] = round(by_kind.get(kind, 0) + rollup["Pss"] / 1024, 2)
    memcg = CGROUP_ROOT / "memory" / NODE_CGROUP / sandbox_id
    usage: float | None = None
    stat: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        usage = round(int((memcg / "memory.usage_in_bytes").read_text()) / MIB, 2)
        for line in (memcg / "memory.stat").read_text().splitlines():
            key, value = line.split()
            if key in ("rss", "cache", "shmem", "mapped_file", "kernel_stack"):
                stat[key] = round(int(value) / MIB, 2)
    return SandboxMemory(
        sandbox_id,
        len(pids),
        round(total["Pss"] / 1024, 2),
        round(total["Pss_Anon"] / 1024, 2),
        round(total["Pss_File"] / 1024, 2),
        round(total["Pss_Shmem"] / 1024, 2),
        by_kind,
        usage,
        stat,
        None,
    )


def measure_memory(report: Report, node: Node, count: int, idle_s: float) -> None:
    """Memory of ``count`` idle sandboxes, each after one command and ``idle_s`` of rest."""
    sandboxes: list[Any] = []
    try:
        for _ in range(count):
            sandbox = node.create()
            sandbox.commands.run("true")  # envd initialised and served a command
            sandboxes.append(sandbox)
        time.sleep(idle_s)
        # envd's own view first (that command is one more spawn), then settle again.
        guest_rss = {}
        for sandbox in sandboxes:
            with contextlib.suppress(Exception):
                out = sandbox.commands.run("grep VmRSS /proc/1/status", user="root").stdout
                guest_rss[sandbox.sandbox_id] = round(int(out.split()[1]) / 1024, 2)
        time.sleep(idle_s)
        for sandbox in sandboxes:
            mem = sandbox_memory(sandbox.sandbox_id)
            mem.envd_guest_rss_mib = guest_rss.get(sandbox.sandbox_id)
            report.memory.append(mem)
        server = _kib(Path(f"/proc/{node.server.process.pid}/smaps_rollup"), ("Pss",))["Pss"]
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    pss = [m.pss_mib for m in report.memory]
    report.memory_summary = {
        "sandboxes": len(pss),
        "idle_s": idle_s,
        "pss_mean_mib": round(statistics.fmean(pss), 2),
        "pss_min_mib": min(pss),
        "pss_max_mib": max(pss),
        "pss_total_mib": round(sum(pss), 2),
        # File pages (mostly the runsc binary) are shared with every runsc process on the
        # machine, so their PSS share shrinks as more sandboxes run: anon + shmem is what
        # each additional sandbox costs.
        "pss_anon_shmem_mean_mib": round(
            statistics.fmean([m.pss_anon_mib + m.pss_shmem_mib for m in report.memory]), 2
        ),
        "server_pss_mib": round(server / 1024, 2),
        "cgroup_usage_mean_mib": round(
            statistics.fmean([m.cgroup_usage_mib or 0.0 for m in report.memory]), 2
        ),
    }


# -- targets and output -----------------------------------------------------------------------


def evaluate_targets(report: Report) -> None:
    def target(name: str, measured: float | None, limit: float, note: str = "") -> None:
        ok = measured is not None and measured <= limit
        report.targets.append(
            {
                "name": name,
                "measured": measured,
                "target": f"<= {limit:g}",
                "pass": ok,
                "note": note,
            }
        )

    bare = report.bare[2].p50_ms if report.bare else None
    for name, rows in report.create.items():
        total = rows[2].p50_ms
        ratio = round(total / bare, 2) if bare else None
        target(
            f"{name}: create → first command p50 / bare runsc p50 (ratio)",
            ratio,
            TARGET_CREATE_RATIO,
            f"{total:.0f} ms / {bare:.0f} ms" if bare else "",
        )
    if report.round_trip:
        target(
            'commands.run("true") p50 through the proxy (ms)',
            report.round_trip[0].p50_ms,
            TARGET_ROUND_TRIP_P50_MS,
        )
    if report.memory_summary:
        target(
            "idle sandbox PSS, mean (MiB)",
            report.memory_summary["pss_mean_mib"],
            TARGET_IDLE_PSS_MIB,
        )


def _mark(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def _lat_rows(rows: list[Latency]) -> list[str]:
    return [
        f"| {r.name} | {r.n} | {r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.mean_ms:.1f} | {r.min_ms:.1f} |"
        for r in rows
    ]


def _phase_text(phases: dict[str, float]) -> str:
    cpu = {k: v for k, v in phases.items() if k.endswith("_cpu_ms")}
    steps = {k: v for k, v in phases.items() if k not in cpu and k != "server_total"}
    parts = []
    if steps:
        total = phases.get("server_total", sum(steps.values()))
        parts.append(f"total {total:.0f} = " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()))
    names = {"sandbox_cpu_ms": "sandbox CPU", "server_cpu_ms": "server CPU"}
    if cpu:
        parts.append(", ".join(f"{names.get(k, k)} {v:.0f}" for k, v in cpu.items()))
    return "; ".join(parts) or "(not logged)"


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def markdown(report: Report) -> str:
    """The report as the tables of docs/benchmarks.md (node server section)."""
    meta = report.meta
    lines = [
        f"{meta['machine']['description']}; {meta['date']}; runsc {meta['runsc']}; "
        f"client e2b {meta['sdk']} (Python {meta['python']}), same machine. "
        f"Load average (1 min) before/after: {meta['loadavg_before'][0]}/"
        f"{meta['loadavg_after'][0]}; at the start of each part: "
        f"{', '.join(f'{x:.1f}' for x in meta.get('loadavg_during', []))}.",
    ]
    header = "| {} | n | p50 ms | p95 ms | mean ms | min ms |\n|---|---:|---:|---:|---:|---:|"
    if report.create:
        runs = len(report.bare_samples)
        lines += ["", header.format(f"Create ({runs} interleaved rounds, after 1 warm-up)")]
        for rows in report.create.values():
            lines += _lat_rows(rows)
        lines += _lat_rows(report.bare)
    if report.phases:
        lines += ["", "| Phases and CPU (p50 ms) | |", "|---|---|"]
        for name, phases in report.phases.items():
            where = " (server log)" if name != "bare" else ""
            lines.append(f"| {name}{where} | {_phase_text(phases)} |")
    if report.round_trip:
        n = report.round_trip[0].n
        d = report.derived
        derived = [
            (
                "bare spawn `/bin/bash -l -c true` (loop inside the sandbox)",
                d["bare_spawn_bash_login_ms"],
            ),
            ("bare spawn `/bin/true` (loop inside the sandbox)", d["bare_spawn_bin_true_ms"]),
            ("SDK round trip p50 - bare `bash -l` spawn", d["overhead_over_bare_bash_ms"]),
            ("proxy cost on `Start` bash (proxy - direct)", d["proxy_start_minus_direct_ms"]),
            ("proxy cost on `/health` (proxy - direct)", d["proxy_health_minus_direct_ms"]),
            (
                "SDK - raw httpx `Start` (same request, both through the proxy)",
                d["sdk_minus_httpx_ms"],
            ),
        ]
        lines += ["", header.format(f"Round trip ({n} interleaved runs)")]
        lines += _lat_rows(report.round_trip)
        lines += [f"| {name} | | {value:.1f} | | | |" for name, value in derived]
    c = report.concurrent
    if c:
        phases = c.get("server_phases_p50_ms", {})
        lines += [
            "",
            f"| {c['count']} concurrent creates (cold node; load {c['loadavg_before']} before) "
            "| p50 ms | p95 ms | max / wall ms |",
            "|---|---:|---:|---:|",
            f"| wall time until {c['succeeded']} of {c['count']} answered a command | | "
            f"| {c['wall_ms']:.0f} |",
            f"| per create: `Sandbox.create()` | {c['create']['p50_ms']:.0f} "
            f"| {c['create']['p95_ms']:.0f} | |",
            f"| per create: create → first command | {c['create_to_first_command']['p50_ms']:.0f} "
            f"| {c['create_to_first_command']['p95_ms']:.0f} | |",
            *[
                f"| server phase {k} | {v:.0f} | | {c['server_phases_max_ms'][k]:.0f} |"
                for k, v in phases.items()
                if k != "server_total"
            ],
            f"| CPU per create (sandbox cgroups + server, mean) | {c['cpu_per_create_ms']:.0f} "
            "| | |"
            if c.get("cpu_per_create_ms") is not None
            else "| CPU per create | n/a | | |",
        ]
    if report.memory:
        s = report.memory_summary
        lines += [
            "",
            f"| Idle sandbox memory ({s['sandboxes']} sandboxes, idle {s['idle_s']:g} s; MiB) "
            "| PSS | anon | file | shmem | sentry | gofer | stubs | memcg usage "
            "| envd RSS (guest) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for m in report.memory:
            k = m.by_kind_mib
            lines.append(
                f"| `{m.sandbox_id}` ({m.processes} processes) | {m.pss_mib:.1f} "
                f"| {m.pss_anon_mib:.1f} | {m.pss_file_mib:.1f} | {m.pss_shmem_mib:.1f} "
                f"| {k.get('runsc-sandbox', 0):.1f} | {k.get('runsc-gofer', 0):.1f} "
                f"| {k.get('systrap stubs', 0):.1f} | {_opt(m.cgroup_usage_mib)} "
                f"| {_opt(m.envd_guest_rss_mib)} |"
            )
        lines += [
            f"| **mean per sandbox** | **{s['pss_mean_mib']:.1f}** | | | | | | "
            f"| {s['cgroup_usage_mean_mib']:.1f} | |",
            f"| mean per sandbox without file pages (anon + shmem) "
            f"| {s['pss_anon_shmem_mean_mib']:.1f} | | | | | | | | |",
            f"| total of the {s['sandboxes']} sandboxes (server not included) "
            f"| {s['pss_total_mib']:.1f} | | | | | | | | |",
            f"| the node server process itself | {s['server_pss_mib']:.1f} | | | | | | | | |",
        ]
    lines += ["", "| Target | Measured | Target | |", "|---|---|---|---|"]
    for t in report.targets:
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(
            f"| {t['name']} | {t['measured']}{note} | {t['target']} | {_mark(t['pass'])} |"
        )
    if report.errors:
        lines += ["", "Errors:", *[f"- {e[:500]}" for e in report.errors]]
    return "\n".join(lines)


def runsc_version() -> str:
    """``runsc --version``'s first line, without the prefix."""
    done = subprocess.run([str(RUNSC), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].removeprefix("runsc version ") if done.stdout else "?"


@contextlib.contextmanager
def nodes_running(warm: bool) -> Iterator[list[Node]]:
    """The cold node (warm pool off) and, if wanted and supported, the warm node (default
    pool); each on half of the benchmark's network slot range."""
    middle = (NET_FIRST + NET_LAST) // 2
    errors: list[str] = []
    nodes: list[Node] = []
    try:
        cold_settings = {"warm_pool_size": "0"} if server_has_setting("warm_pool_size") else {}
        nodes.append(start_node("cold", NET_FIRST, middle, **cold_settings))
        if warm and server_has_setting("warm_pool_size"):
            nodes.append(start_node("warm", middle + 1, NET_LAST))
        yield nodes
    finally:
        for node in nodes:
            stop_node(node, errors)
        sweep_slots(NET_FIRST, NET_LAST, errors)
        for e in errors:
            print(f"error: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts, write the JSON, print the markdown; 1 if something broke."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-runs", type=int, default=20, help="timed create rounds")
    parser.add_argument("--rt-runs", type=int, default=50, help="timed round trips per row")
    parser.add_argument("--rt-warmup", type=int, default=5)
    parser.add_argument("--loop", type=int, default=20, help="spawns per in-sandbox loop")
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--memory-sandboxes", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds before memory")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-pool node")
    parser.add_argument(
        "--only",
        default="create,rt,concurrent,memory",
        help="comma-separated subset of: create, rt, concurrent, memory",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    only = set(args.only.split(","))

    import e2b  # after argparse: --help should not pay for the SDK import

    load_before = os.getloadavg()
    if load_before[0] > LOAD_WARN:
        print(
            f"warning: 1-minute load average is {load_before[0]:.2f} on {os.cpu_count()} CPUs; "
            "something else is running and the numbers will be noisy",
            file=sys.stderr,
        )
    report = Report(
        meta={
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "runsc": runsc_version(),
            "python": platform.python_version(),
            "sdk": getattr(e2b, "__version__", None) or "2.63.0",
            "args": {k: str(v) for k, v in vars(args).items()},
            "loadavg_before": [round(x, 2) for x in load_before],
            "server_settings": {
                "warm_pool_size": Settings.model_fields["warm_pool_size"].default
                if server_has_setting("warm_pool_size")
                else None,
                "default_cpu_count": Settings.model_fields["default_cpu_count"].default,
                "default_memory_mb": Settings.model_fields["default_memory_mb"].default,
            },
        }
    )
    loads: list[float] = []
    warm = not args.no_warm and "create" in only
    with nodes_running(warm) as nodes:
        cold = nodes[0]
        report.meta["nodes"] = {n.name: {"warm_pool_size": n.warm_pool} for n in nodes}
        if "create" in only:
            probe = cold.create()
            try:
                rootfs = template_rootfs(cold, probe.sandbox_id)
            finally:
                probe.kill()
            bare = BareRunsc(
                rootfs,
                Settings.model_fields["default_cpu_count"].default,
                Settings.model_fields["default_memory_mb"].default,
            )
            print(
                f"measuring create ({', '.join(n.name for n in nodes)}, bare) ...", file=sys.stderr
            )
            try:
                loads.append(os.getloadavg()[0])
                measure_create(report, nodes, bare, args.create_runs)
            finally:
                bare.close()
            for extra in nodes[1:]:  # idle warm sandboxes would only add noise below
                stop_node(extra, report.errors)
            del nodes[1:]
        if "rt" in only:
            print("measuring round trips ...", file=sys.stderr)
            loads.append(os.getloadavg()[0])
            measure_round_trip(report, cold, args.rt_runs, args.rt_warmup, args.loop)
        if "concurrent" in only:
            print(f"measuring {args.concurrent} concurrent creates ...", file=sys.stderr)
            loads.append(os.getloadavg()[0])
            measure_concurrent(report, cold, args.concurrent)
        if "memory" in only:
            print(
                f"measuring idle memory of {args.memory_sandboxes} sandboxes ...", file=sys.stderr
            )
            loads.append(os.getloadavg()[0])
            measure_memory(report, cold, args.memory_sandboxes, args.idle)
    report.meta["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    report.meta["server_log_lines"] = SERVER_LOG_LINES
    report.meta["loadavg_during"] = loads
    evaluate_targets(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    print(markdown(report))
    print(f"\nresults: {args.out}", file=sys.stderr)
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
