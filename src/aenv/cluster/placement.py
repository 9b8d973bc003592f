"""Which node a sandbox goes to: filter, sample, score. Pure functions over heartbeats.

1. **Filter**: healthy and ready (``model.Health.READY``), free capacity by its last
   heartbeat, and, when the sandbox restores a memory image, the same host key
   (``restore_match.requirements_key``: runtime, its build and platform, CPU flags) as the
   node that made the image (the image restores only there).
2. **Sample** ``SAMPLE`` of them at random (the "power of d choices": each scheduler replica
   looks at a few nodes, not all, so replicas placing at once spread instead of all picking
   the one best node), plus every node with locality (below): those are worth looking at.
3. **Score** each, lower is better: load (CPU, memory, capacity used, starts in flight) minus
   locality bonuses (the sandbox's origin node for a resume, a volume it mounts checked out
   there — elsewhere the create would wait for that node to let the volume go, or be refused
   while a sandbox there writes it —, its snapshot cached, a warm-pool sandbox of its
   template free, its template's layers cached).

The scheduler then reserves (``reserve.py``) in score order until one reservation holds; the
order is a preference, the reservation the decision.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from aenv.cluster.model import Health, NodeInfo

SAMPLE = 3
#: Score weights: load terms are fractions in [0, 1]; bonuses subtract.
W_CPU, W_MEMORY, W_USED, W_STARTING = 0.3, 0.3, 0.3, 0.1
BONUS_ORIGIN, BONUS_SNAPSHOT, BONUS_WARM, BONUS_TEMPLATE = 0.4, 0.3, 0.3, 0.15
#: Above every load: a volume is mounted only where it is checked out.
BONUS_VOLUME = 2.0


@dataclass(frozen=True)
class Want:
    """What is being placed. ``host_key``: set when it restores a memory image, the key of
    the host that made it; ``origin``: the node it was paused on."""

    template_id: str = ""
    snapshot_id: str | None = None
    origin: str | None = None
    host_key: str | None = None
    exclude: frozenset[str] = field(default_factory=frozenset)
    volumes: frozenset[str] = field(default_factory=frozenset)


def eligible(node: NodeInfo, want: Want, now_ms: int) -> bool:
    if node.node_id in want.exclude or node.health(now_ms) is not Health.READY:
        return False
    if node.running >= node.limit:
        return False
    return not (want.host_key and node.host_key != want.host_key)


def score(node: NodeInfo, want: Want) -> float:
    load = (W_CPU * min(node.cpu_pct / 100, 1.0)
            + W_MEMORY * min(node.memory_used / max(node.memory_total, 1), 1.0)
            + W_USED * min(node.running / max(node.limit, 1), 1.0)
            + W_STARTING * min(node.starting / max(node.starting_limit, 1), 1.0))
    bonus = 0.0
    if want.origin and node.node_id == want.origin:
        bonus += BONUS_ORIGIN
    if want.volumes.intersection(node.volumes):
        bonus += BONUS_VOLUME
    if want.snapshot_id and want.snapshot_id in node.snapshots:
        bonus += BONUS_SNAPSHOT
    if want.template_id and node.warm.get(want.template_id, 0) > 0:
        bonus += BONUS_WARM
    if want.template_id and want.template_id in node.templates:
        bonus += BONUS_TEMPLATE
    return load - bonus


def local(node: NodeInfo, want: Want) -> bool:
    return bool((want.origin and node.node_id == want.origin)
                or want.volumes.intersection(node.volumes)
                or (want.snapshot_id and want.snapshot_id in node.snapshots)
                or (want.template_id and node.warm.get(want.template_id, 0) > 0))


def candidates(nodes: Sequence[NodeInfo], want: Want, now_ms: int, *,
               sample: int = SAMPLE, rng: random.Random | None = None) -> list[NodeInfo]:
    """The nodes to try, best first: a sample of the eligible ones plus every local one, by
    score; then the rest of the eligible ones, by score (a fallback when the first choices'
    reservations fail)."""
    rng = rng or random.Random()
    ok = [n for n in nodes if eligible(n, want, now_ms)]
    chosen = {n.node_id for n in ok if local(n, want)}
    others = [n for n in ok if n.node_id not in chosen]
    chosen.update(n.node_id for n in rng.sample(others, min(sample, len(others))))
    first = sorted((n for n in ok if n.node_id in chosen), key=lambda n: score(n, want))
    rest = sorted((n for n in ok if n.node_id not in chosen), key=lambda n: score(n, want))
    return first + rest
