"""Store records -> E2B wire models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aenv.api.schemas import (
    Lifecycle,
    ListedSandbox,
    SandboxDetail,
    SandboxMetric,
    SandboxOut,
    VolumeMountOut,
)
from aenv.core.settings import Settings
from aenv.core.states import SandboxState
from aenv.envd import ENVD_VERSION
from aenv.orchestrator import egress, traffic
from aenv.orchestrator.liveness import Verdict
from aenv.orchestrator.ops.metrics import MetricSample
from aenv.orchestrator.workload_identity import iam_body
from aenv.store.models import SandboxRecord


def iso(ts: float, timespec: str = "microseconds") -> str:
    """RFC 3339 in UTC with a ``Z``, as E2B sends timestamps (to ``timespec``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec).replace(
        "+00:00", "Z"
    )


def sandbox_out(record: SandboxRecord, settings: Settings) -> SandboxOut:
    return SandboxOut(
        templateID=record.template_id,
        sandboxID=record.sandbox_id,
        clientID=record.client_id,
        envdVersion=ENVD_VERSION,
        envdAccessToken=record.envd_token,
        trafficAccessToken=traffic.token_for_client(record),
        domain=settings.sandbox_domain,
        alias=record.alias,
    )


def listed(record: SandboxRecord) -> ListedSandbox:
    return ListedSandbox(
        templateID=record.template_id,
        alias=record.alias,
        sandboxID=record.sandbox_id,
        clientID=record.client_id,
        startedAt=iso(record.started_at),
        endAt=iso(record.end_at),
        cpuCount=record.cpu_count,
        memoryMB=record.memory_mb,
        diskSizeMB=record.disk_size_mb,
        state=record.state.public,
        envdVersion=ENVD_VERSION,
        metadata=record.metadata,
        volumeMounts=[VolumeMountOut(name=str(m["name"]), path=str(m["path"]),
                                     readOnly=bool(m.get("read_only")))
                      for m in record.volume_mounts or ()],
    )


def detail(record: SandboxRecord, settings: Settings,
           unresponsive: Verdict | None = None) -> SandboxDetail:
    """``unresponsive``: the liveness verdict on its envd, if any (``node.liveness``)."""
    return SandboxDetail(
        **listed(record).model_dump(),
        envdAccessToken=record.envd_token,
        domain=settings.sandbox_domain,
        allowInternetAccess=record.allow_internet_access,
        network=egress.shown(record.network),
        iam=iam_body(egress.identity_of(record)),
        lifecycle=Lifecycle(
            onTimeout="pause" if record.auto_pause else "kill", autoResume=record.auto_resume,
            autoPauseMemory=record.auto_pause_memory,
        ),
        **_paused_fields(record),
        **unresponsive_fields(unresponsive),
    )


def unresponsive_fields(verdict: Verdict | None) -> dict[str, Any]:
    """``SandboxDetail``'s envd-liveness fields (none while envd answers)."""
    if verdict is None:
        return {}
    return {"envdUnresponsive": True, "envdUnresponsiveReason": verdict.reason,
            "envdUnresponsiveSince": iso(verdict.since)}


def _paused_fields(record: SandboxRecord) -> dict[str, Any]:
    if record.state not in (SandboxState.PAUSED, SandboxState.PAUSING):
        return {}
    filesystem = bool((record.instance or {}).get("filesystem"))
    return {"pauseMode": "filesystem" if filesystem else "full",
            "envdUnresponsiveAtPause": bool((record.instance or {}).get("envd_unresponsive"))}


def metric_out(sample: MetricSample) -> SandboxMetric:
    """A sandbox's usage sample in E2B's ``SandboxMetric``."""
    stats = sample.stats
    return SandboxMetric(
        timestamp=iso(sample.timestamp), timestampUnix=int(sample.timestamp),
        cpuCount=stats.cpu_count, cpuUsedPct=stats.cpu_used_pct, memUsed=stats.mem_used,
        memTotal=stats.mem_total, memCache=stats.mem_cache, diskUsed=stats.disk_used,
        diskTotal=stats.disk_total)
