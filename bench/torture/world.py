"""What the torture's clients know about their sandboxes, and what they found wrong."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Known:
    """One sandbox as the clients know it: the files they wrote and were told were written
    (path → content), and whether it was killed on purpose."""

    sandbox_id: str
    files: dict[str, str] = field(default_factory=dict)
    killed: bool = False
    #: It may be gone without a kill the clients saw answered: its timeout was set to 0 (the
    #: node pauses or kills it on its own), or the node died under a kill of it.
    expires: bool = False
    #: Created with ``on_timeout: kill`` (or forked from one: children keep the parent's
    #: policy): its timeout may run out between the clients' calls, and the node kills it.
    kills_on_timeout: bool = False
    #: The SDK's handle (envd traffic through the proxy with the sandbox's own token).
    handle: Any = None


@dataclass
class World:
    sandboxes: dict[str, Known] = field(default_factory=dict)
    snapshots: set[str] = field(default_factory=set)
    #: (operation, outcome) → count; outcome is the HTTP status or an exception's name.
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Broken invariants, each one line: the run fails if any.
    violations: list[str] = field(default_factory=list)
    kill_seconds: list[float] = field(default_factory=list)
    #: Set while the node is down (killed, restarting): calls failing to connect are expected.
    node_down: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sandbox_id: str, files: dict[str, str] | None = None) -> Known:
        with self.lock:
            known = self.sandboxes[sandbox_id] = Known(sandbox_id, dict(files or {}))
            return known

    def live(self) -> list[Known]:
        with self.lock:
            return [k for k in self.sandboxes.values() if not k.killed]

    def count(self, operation: str, outcome: str) -> None:
        with self.lock:
            self.outcomes[(operation, outcome)] += 1

    def violate(self, message: str) -> None:
        with self.lock:
            self.violations.append(message)
