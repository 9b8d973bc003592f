"""The node servers under test: start, reach with the SDK, stop, and clean up after them."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.server.harness import NodeServer, cleanup_home, client_env, start_server

from aenv.core.settings import Settings
from bench.node_bench.common import ms_since

#: Network slot range of this benchmark's nodes (disjoint from other users of the machine);
#: the cold and the warm node split it.
NET_FIRST, NET_LAST = 50000, 50999
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
