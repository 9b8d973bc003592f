"""Sandbox logs, team metrics, webhooks, and the audit trail."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class ObserveSettings(Section):
    """Observability: sandbox logs, metrics, webhooks, and the audit trail."""

    audit_max_entries: int = Field(default=100_000, ge=100)
    """The audit log (``GET /audit``, ``aenv audit``, docs/audit.md) keeps this many entries,
    the newest; older ones are dropped as new ones are written."""

    observe: bool = True
    """Sandbox logs, lifecycle webhooks, team metrics and the node's gauges (docs/metrics.md).
    Off: none of them is recorded (the logs and metrics routes answer empty), for measuring
    what they cost (``bench.observe_bench``); Prometheus counters and histograms stay."""

    sandbox_log_max_entries: int = Field(default=10_000, ge=100)
    """Each sandbox's logs (E2B's logs API, ``aenv logs``, docs/logs.md) keep about this many
    entries, the newest: lifecycle events and console lines."""

    sandbox_log_keep_s: float = Field(default=86_400.0, ge=60)
    """A gone sandbox's logs are kept this long after their last entry, for its team to
    read; then dropped."""

    team_metrics_keep_s: float = Field(default=7 * 86_400.0, ge=3600)
    """Each team's samples (sandboxes up, starts per second: ``GET /teams/{id}/metrics``,
    docs/metrics.md) are kept this long."""

    webhook_allow_private: bool = False
    """Whether lifecycle webhooks (docs/webhooks.md) may be delivered to loopback, private and
    link-local addresses. Off: a team cannot use the node to reach the node's own network."""

    webhook_retry_max_s: float = Field(default=300.0, ge=1)
    """A failed webhook delivery is tried again after 1, 2, 4 … seconds, at most this long
    apart."""

    webhook_give_up_s: float = Field(default=86_400.0, ge=60)
    """A webhook delivery still failing this long after its event is given up (failed in
    its delivery log)."""
