"""The gateway's and the scheduler's Prometheus metrics (docs/metrics.md, "Prometheus"), each
on a registry of its own (the node's is ``core/telemetry.py``)."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from aenv.cluster.model import Health, NodeInfo

#: Seconds: a gateway request runs from a cached lookup (~1 ms) to a cold create (minutes).
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 120.0)

GATEWAY = CollectorRegistry()
ProcessCollector(registry=GATEWAY)
GATEWAY_REQUESTS = Counter(
    "aenv_gateway_requests_total",
    "Requests through the gateway by route (create, list, fork, sandbox, sandbox_traffic, "
    "metrics, other) and status class", ["route", "code"], registry=GATEWAY)
GATEWAY_SECONDS = Histogram(
    "aenv_gateway_request_seconds", "Seconds to answer a request through the gateway",
    ["route"], buckets=REQUEST_BUCKETS, registry=GATEWAY)

SCHEDULER = CollectorRegistry()
ProcessCollector(registry=SCHEDULER)
PLACEMENTS = Counter(
    "aenv_scheduler_placements_total",
    "Placements by outcome (ok, cluster_full, quota_exceeded, no_nodes)", ["outcome"],
    registry=SCHEDULER)
PLACEMENT_SECONDS = Histogram(
    "aenv_scheduler_placement_seconds", "Seconds to place (read the heartbeats, reserve)",
    buckets=REQUEST_BUCKETS, registry=SCHEDULER)
NODES = Gauge("aenv_cluster_nodes", "Nodes by health (ready, draining, suspect, lost)",
              ["health"], registry=SCHEDULER)
CAPACITY = Gauge(
    "aenv_cluster_sandboxes",
    "Over the nodes not lost: their limit of sandboxes and the sandboxes they run",
    ["kind"], registry=SCHEDULER)

_ROUTES = (("create", re.compile(r"^/(?:v\d+/)?sandboxes$"), "POST"),
           ("list", re.compile(r"^/(?:v\d+/)?sandboxes$"), "GET"),
           ("metrics", re.compile(r"^/sandboxes/metrics$|^/teams/[^/]+/metrics"), None),
           ("fork", re.compile(r"^/sandboxes/[^/]+/fork$"), "POST"),
           ("sandbox", re.compile(r"^/(?:v\d+/)?sandboxes/[^/]+"), None))


def route_of(method: str, path: str) -> str:
    """A request's route label: one of a few, never the path itself (bounded cardinality)."""
    for name, pattern, only in _ROUTES:
        if (only is None or only == method) and pattern.match(path):
            return name
    return "other"


def code_class(status: int) -> str:
    return f"{status // 100}xx"


def set_nodes(nodes: list[NodeInfo], now_ms: int) -> None:
    """The scheduler's gauges from the nodes' heartbeats."""
    counts = dict.fromkeys((h.value for h in Health), 0)
    limit = running = 0
    for node in nodes:
        health = node.health(now_ms)
        counts[health.value] += 1
        if health is not Health.LOST:
            limit, running = limit + node.limit, running + node.running
    for health_name, count in counts.items():
        NODES.labels(health=health_name).set(count)
    CAPACITY.labels(kind="limit").set(limit)
    CAPACITY.labels(kind="running").set(running)
