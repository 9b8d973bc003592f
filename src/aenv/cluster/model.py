"""A node as its last heartbeat describes it, and its health by that heartbeat's age.

Health, from the scheduler's side (the node itself only ever says ``ready`` or ``draining``):

======== ============================================================= ====================
health   when                                                          placements
======== ============================================================= ====================
ready    heartbeat younger than ``suspect_after_s``, node says ready   yes
draining heartbeat younger than ``suspect_after_s``, node says draining no (its sandboxes
                                                                        are being moved)
suspect  heartbeat between ``suspect_after_s`` and ``lost_after_s`` old no; calls still go
                                                                        to it
lost     heartbeat older than ``lost_after_s``                          no; its running
                                                                        sandboxes are lost
======== ============================================================= ====================

With the defaults (a heartbeat every 2 s) a hung node is suspect 6-8 s after its last
heartbeat and lost 20-22 s after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, Field

HEARTBEAT_INTERVAL_S = 2.0
SUSPECT_AFTER_S = 6.0
LOST_AFTER_S = 20.0


class Health(StrEnum):
    READY = "ready"
    DRAINING = "draining"
    SUSPECT = "suspect"
    LOST = "lost"


class NodeInfo(BaseModel):
    """One heartbeat. ``heartbeat_ms`` is Redis's clock when it was written (every reader
    compares it with Redis's clock too, so node and scheduler clocks never matter)."""

    node_id: str
    address: str = Field(description="the node's API and proxy base URL, e.g. http://10.0.0.5:3000")
    state: str = "ready"  # the node's own word: ready or draining
    limit: int = Field(ge=0, description="sandboxes the node runs at most")
    starting_limit: int = Field(ge=1, description="creates/resumes/forks in flight at most")
    running: int = 0
    starting: int = 0
    cpu_pct: float = 0.0  # of the whole machine, 0-100
    memory_used: int = 0
    memory_total: int = 1
    host_key: str = Field("", description="restore_match.requirements_key of the node: "
                                          "runtime, its build and platform, CPU flags")
    templates: list[str] = Field(default_factory=list, description="templates cached locally")
    snapshots: list[str] = Field(default_factory=list, description="snapshots cached locally")
    warm: dict[str, int] = Field(default_factory=dict, description="template → warm sandboxes")
    volumes: list[str] = Field(default_factory=list,
                               description="names of the volumes checked out on the node")
    heartbeat_ms: int = 0

    def to_redis(self) -> dict[str, str]:
        return {k: json.dumps(v) for k, v in self.model_dump(exclude={"heartbeat_ms"}).items()}

    @classmethod
    def from_redis(cls, fields: Mapping[str, str]) -> NodeInfo:
        data = {k: json.loads(v) for k, v in fields.items() if k != "heartbeat_ms"}
        return cls(**data, heartbeat_ms=int(fields.get("heartbeat_ms", "0")))

    def health(self, now_ms: int, *, suspect_after_s: float = SUSPECT_AFTER_S,
               lost_after_s: float = LOST_AFTER_S) -> Health:
        age_s = (now_ms - self.heartbeat_ms) / 1000
        if age_s >= lost_after_s:
            return Health.LOST
        if age_s >= suspect_after_s:
            return Health.SUSPECT
        return Health.DRAINING if self.state == "draining" else Health.READY
