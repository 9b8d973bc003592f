"""The node under test, with the log-line readers the lifecycle benchmark needs."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.server.harness import start_server

from aenv.core.settings import Settings
from bench.lifecycle.common import (
    CREATED_KIND_RE,
    PAUSE_HOT_S,
    PRECREATED_RE,
    REQUEST_TIMEOUT_S,
    SANDBOX_TIMEOUT_S,
    WARM_READY_RE,
    log,
)
from bench.node_bench.common import ms_since
from bench.node_bench.node import PHASE_RE, Node, remove_home, stop_node

#: The product default (the harness's servers default to 0).
PRECREATE_POOL = int(Settings.model_fields["precreate_pool_size"].default)
RESUME_READY = int(Settings.model_fields["resume_ready_size"].default)


# -- the node ---------------------------------------------------------------------------------


@dataclass
class LifecycleNode(Node):
    """The node under test, with the log-line readers this benchmark needs. The log is read
    incrementally (polled often, it grows to thousands of lines)."""

    workspace: str = "disk"
    _offset: int = 0
    _lines: list[str] = field(default_factory=list)
    _found: dict[re.Pattern[str], list[re.Match[str]]] = field(default_factory=dict)

    def _refresh(self) -> None:
        try:
            with open(self.server.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        cut = data.rfind(b"\n") + 1
        self._offset += cut
        new = data[:cut].decode(errors="replace").splitlines()
        self._lines += new
        for regex, found in self._found.items():
            found += [m for line in new if (m := regex.search(line))]

    def opts(self) -> dict[str, Any]:
        return {**self.sdk_opts(), "request_timeout": REQUEST_TIMEOUT_S}

    def create(self, **kwargs: Any) -> Any:
        from e2b import Sandbox

        return Sandbox.create(timeout=SANDBOX_TIMEOUT_S, **self.opts(), **kwargs)

    def connect(self, sandbox_id: str) -> Any:
        from e2b import Sandbox

        return Sandbox.connect(sandbox_id, timeout=SANDBOX_TIMEOUT_S, **self.opts())

    def matches(self, regex: re.Pattern[str]) -> list[re.Match[str]]:
        self._refresh()
        if regex not in self._found:
            self._found[regex] = [m for line in self._lines if (m := regex.search(line))]
        return list(self._found[regex])

    def wait_line(
        self,
        regex: re.Pattern[str],
        where: Callable[[re.Match[str]], bool],
        skip: int,
        timeout: float = 120.0,
    ) -> re.Match[str] | None:
        """The first line matching ``regex`` and ``where`` after the ``skip`` first ones."""
        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.matches(regex) if where(m)]
            if len(found) > skip:
                return found[skip]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def count(self, regex: re.Pattern[str], where: Callable[[re.Match[str]], bool]) -> int:
        return sum(1 for m in self.matches(regex) if where(m))

    def created(self) -> dict[str, dict[str, float]]:
        """``created`` lines by sandbox id: kind (1 = warm) and phases (ms)."""
        found: dict[str, dict[str, float]] = {}
        for m in self.matches(CREATED_KIND_RE):
            phases = {k: float(v) for k, v in PHASE_RE.findall(m["phases"])}
            found[m["id"]] = {
                "total": float(m["total"]),
                "warm": float(m["kind"] == "warm"),
                **phases,
                # After the phases: one of them is called "precreated" (its wait, ms).
                "from_precreated": float(m["kind"] == "pre-created"),
            }
        return found

    def pool_ready(self) -> int:
        """Warm sandboxes ready now, from the log (ready lines minus claimed ones)."""
        ready = {m["id"] for m in self.matches(WARM_READY_RE)}
        return len(ready - set(self.created()))

    def wait_pool_full(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pool_ready() >= self.warm_pool:
                return True
            time.sleep(0.05)
        return False

    def precreated_made(self) -> int:
        """Sandboxes of the pre-created pool made so far (log lines)."""
        return len(self.matches(PRECREATED_RE))

    def wait_precreated(self, since: int, needed: int, timeout: float = 120.0) -> bool:
        """Wait until ``needed`` pre-created sandboxes were made after the ``since``-th one
        (the pool refills only while no create or fork runs): before a timed fork, so it
        finds the pool as full as a quiet node would have it."""
        deadline = time.monotonic() + timeout
        while self.precreated_made() - since < needed:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        # The line is logged before the sandbox joins the pool: let the last one land.
        time.sleep(0.05)
        return True

    def lowers(self, sandbox_id: str) -> list[Path]:
        """The read-only layers under a sandbox's rootfs (lowest first)."""
        record = self.server.home / "sandboxes" / sandbox_id / "rootfs.json"
        return [Path(p) for p in json.loads(record.read_text())["lowers"]]


def start_node(workspace: str = "disk", name: str = "lifecycle", **settings: str
               ) -> LifecycleNode:
    """A node with the product's defaults (the harness turns the pre-created pool and the
    ready-to-resume sandboxes off unless told): ``workspace`` mode, the default pre-created
    and warm pools, paused sandboxes kept ready to resume; ``settings`` over them."""
    started = time.perf_counter()
    server = start_server(
        free_port(),
        None,
        pause_hot_s=str(PAUSE_HOT_S),
        workspace=workspace,
        precreate_pool_size=str(PRECREATE_POOL),
        resume_ready_size=str(RESUME_READY),
        **settings,
    )
    first = int(server.env["AENV_NET_FIRST_INDEX"])
    last = int(server.env["AENV_NET_LAST_INDEX"])
    pool = int(Settings.model_fields["warm_pool_size"].default)
    node = LifecycleNode(name, server, pool, (first, last), workspace=workspace)
    # The first pool of the default template's shape, before anything is timed.
    if not node.wait_precreated(0, PRECREATE_POOL, 180):
        log(f"warning: {name}: pre-created pool not full after 180 s")
    log(
        f"node {name} ({workspace} workspaces) on {server.url} (slots {first}-{last}, "
        f"home {server.home}) up in "
        f"{ms_since(started):.0f} ms"
    )
    return node


def stop_lifecycle_node(node: LifecycleNode, errors: list[str]) -> None:
    """``node_bench.node.stop_node``, which counts any mount under the home as a leftover: a node
    with disk workspaces leaves its workspace pool (``<home>/workspaces``) mounted by design,
    so when nothing else of it is left the home is removed (unmounting it) without an error."""
    mine: list[str] = []
    stop_node(node, mine)
    home = node.server.home
    if any("remain" in e for e in mine) and _only_workspace_mounts(home):
        mine = [e for e in mine if "remain" not in e]
        remove_home(home)
    errors += mine


def _only_workspace_mounts(home: Path) -> bool:
    prefix = str(home.resolve()) + "/"
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    if any(not m.startswith(prefix + "workspaces") for m in mounts):
        return False
    needle = str(home).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    return False
    return True
