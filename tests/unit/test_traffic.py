"""Inbound settings of a sandbox (``orchestrator/traffic.py``), pure: when the traffic token is
asked for, whose it is, the masked Host, what an egress update keeps, bad values refused."""

from __future__ import annotations

import time

import pytest

from aenv.core.errors import InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator import traffic
from aenv.store.models import SandboxRecord


def _record(sandbox_id: str, network: dict[str, object] | None, token: str = "envd-a"
            ) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(
        sandbox_id=sandbox_id, template_id="base", state=SandboxState.RUNNING, version=1,
        created_at=now, started_at=now, end_at=now + 60, cpu_count=1, memory_mb=256,
        disk_size_mb=1024, envd_token=token, client_id="c", network=network)


def test_the_token_is_asked_for_only_when_public_traffic_is_off() -> None:
    private = _record("s1", {"allowPublicTraffic": False})
    public = _record("s2", {"allowPublicTraffic": True})
    unset = _record("s3", None)
    token = traffic.token_for_client(private)
    assert token and traffic.admits(private, token)
    assert not traffic.admits(private, None) and not traffic.admits(private, token + "x")
    assert traffic.token_for_client(public) is None and traffic.admits(public, None)
    assert traffic.token_for_client(unset) is None and traffic.admits(unset, None)
    # Each sandbox its own: another id, or the same id with another envd token, differs.
    assert traffic.token_of(_record("s4", {"allowPublicTraffic": False})) != token
    assert traffic.token_of(_record("s1", {"allowPublicTraffic": False}, "envd-b")) != token


def test_masked_host_and_what_an_egress_update_keeps() -> None:
    record = _record("s1", {"maskRequestHost": "app.internal:${PORT}"})
    assert traffic.masked_host(record, 8080) == "app.internal:8080"
    assert traffic.masked_host(_record("s2", None), 8080) is None
    old = {"allowPublicTraffic": False, "maskRequestHost": "h", "allowOut": ["1.1.1.1"]}
    assert traffic.keep_inbound(old, {"denyOut": ["10.0.0.0/8"]}) == {
        "allowPublicTraffic": False, "maskRequestHost": "h", "denyOut": ["10.0.0.0/8"]}
    assert traffic.keep_inbound(None, {"allowOut": []}) == {"allowOut": []}


@pytest.mark.parametrize("network", [
    {"allowPublicTraffic": "no"}, {"maskRequestHost": 5}, {"maskRequestHost": "a\r\nX-Evil: 1"},
    {"maskRequestHost": "h" * 300}, {"maskRequestHost": "host/path"},
])
def test_bad_inbound_values_are_refused(network: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        traffic.check(network)


def test_good_inbound_values_pass() -> None:
    traffic.check(None)
    traffic.check({"allowPublicTraffic": False, "maskRequestHost": "localhost:${PORT}"})
