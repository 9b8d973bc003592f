"""A Prometheus scrape as Prometheus takes it, parsed by ``prometheus_client``'s own parser:
sample name → (sorted label pairs) → value (tests/server/test_prometheus.py and the cluster's
roles in tests/cluster/test_teams_cluster.py)."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, dict[tuple[Any, ...], float]]


def scrape(url: str, headers: dict[str, str]) -> Samples:
    answer = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples
