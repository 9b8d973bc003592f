"""A node's Prometheus metrics (``GET /metrics``; docs/metrics.md, "Prometheus"), on a
registry of the node's own (``NODE``): the families the layers above record into as things
happen (operations, refusals, proxied requests) and the gauges a loop sets from the node's
state (``orchestrator/fleet_gauges.py``). The gateway and the scheduler have registries of
their own (``cluster/telemetry.py``).
"""

from __future__ import annotations

import asyncio

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from aenv.core.errors import AenvError

#: Seconds: lifecycle operations run from ~10 ms (a thaw) to minutes (a cold pull).
OPERATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0, 120.0, 300.0)
#: Seconds to a proxied response's first byte.
PROXY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

NODE = CollectorRegistry()
ProcessCollector(registry=NODE)

OPERATION_SECONDS = Histogram(
    "aenv_operation_seconds",
    "Lifecycle operations by name (create, pause, resume, snapshot, fork, kill, spill, "
    "network) and outcome (ok, or the error's code), in seconds",
    ["operation", "outcome"], buckets=OPERATION_BUCKETS, registry=NODE)
REFUSALS = Counter(
    "aenv_admission_refusals_total",
    "Starts refused before they began, by reason (node_full, queue_full, team_quota)",
    ["reason"], registry=NODE)
PROXY_REQUESTS = Counter(
    "aenv_proxy_requests_total",
    "Requests to sandboxes through the node's proxy, by status class (2xx … 5xx; none: "
    "the client left before an answer)", ["code"], registry=NODE)
PROXY_SECONDS = Histogram(
    "aenv_proxy_response_seconds",
    "Seconds from a proxied request to its answer's first byte",
    buckets=PROXY_BUCKETS, registry=NODE)
SANDBOXES = Gauge("aenv_sandboxes", "Sandboxes on the node by state", ["state"],
                  registry=NODE)
POOL_READY = Gauge(
    "aenv_pool_ready",
    "What the node's pools hold ready (warm sandboxes, pre-created sandboxes, paused "
    "sandboxes ready to resume, network slots)",
    ["pool"], registry=NODE)
ALLOCATED = Gauge(
    "aenv_allocated",
    "What the node's sandboxes up were given (cpus; memory_bytes)", ["resource"],
    registry=NODE)
HOST = Gauge(
    "aenv_host",
    "The machine: cpus, cpu_busy_ratio, memory_total_bytes, memory_used_bytes",
    ["resource"], registry=NODE)
OVERCOMMIT = Gauge(
    "aenv_memory_overcommit_ratio",
    "Memory the sandboxes up were given over the memory the machine uses", registry=NODE)
BLOB_READS = Counter(
    "aenv_repository_blob_reads_total",
    "Repository blobs a node needed (memory images, layers, disks), by where they came from: "
    "cache (this node's blob cache: a hit), peer (another node), repository (a miss)",
    ["source"], registry=NODE)
BLOB_BYTES = Counter(
    "aenv_repository_blob_bytes_total", "Bytes of those blobs, by where they came from",
    ["source"], registry=NODE)
CACHE_BYTES = Gauge(
    "aenv_cache_bytes",
    "Bytes held on the node: the repository's blob cache (blob_cache), the layer store "
    "(layers)", ["cache"], registry=NODE)
LOG_ENTRIES = Counter(
    "aenv_sandbox_log_entries_total", "Sandbox log entries written, by source",
    ["source"], registry=NODE)


def outcome_of(failure: BaseException | None) -> str:
    """An operation's outcome label: ``ok``, the error's code, or ``cancelled`` / ``error``."""
    if failure is None:
        return "ok"
    if isinstance(failure, AenvError):
        return failure.connect_code
    if isinstance(failure, asyncio.CancelledError):
        return "cancelled"
    return "error"


def observe_operation(name: str, failure: BaseException | None, seconds: float) -> None:
    OPERATION_SECONDS.labels(operation=name, outcome=outcome_of(failure)).observe(seconds)


def exposition(registry: CollectorRegistry = NODE) -> tuple[bytes, str]:
    """The registry in Prometheus's text format, and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
