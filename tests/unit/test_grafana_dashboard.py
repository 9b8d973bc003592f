"""The Grafana dashboard (deploy/grafana/aenv-dashboard.json, docs/metrics.md) asks only for
what aenv exports: every metric an expression names is a sample of a family of the node's,
the gateway's or the scheduler's registry (``core/telemetry.py``, ``cluster/telemetry.py``),
so a renamed family cannot leave a panel silently empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from aenv.cluster import telemetry as cluster_telemetry
from aenv.core import telemetry

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "aenv-dashboard.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "gauge": ("",)}


def _exported(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
    return names


def test_every_panel_asks_for_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = (_exported(telemetry.NODE) | _exported(cluster_telemetry.GATEWAY)
                | _exported(cluster_telemetry.SCHEDULER))
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 15
    asked: set[str] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            asked |= set(re.findall(r"\b((?:aenv|process)_[a-z_]+)\b", expr))
    assert asked and asked <= exported, sorted(asked - exported)
    # Every family of the node's is on the dashboard somewhere.
    node_families = {f.name for f in telemetry.NODE.collect() if f.name.startswith("aenv_")}
    assert all(any(name.startswith(f) for name in asked) for f in node_families), \
        sorted(f for f in node_families if not any(a.startswith(f) for a in asked))
