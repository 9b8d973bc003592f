"""The client's backoff rules (``aenv.client.backoff``) and its retry loop (``rest.py``) over
httpx's ``MockTransport``: Retry-After honoured, jitter bounded, the deadline final."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from aenv.client.backoff import MAX_RETRY_AFTER_S, Backoff, Deadline, parse_retry_after
from aenv.client.errors import CapacityError, Conflict, SandboxLost, Unavailable
from aenv.client.rest import NodeApi, RetryPolicy

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# -- Retry-After --

@pytest.mark.parametrize(("header", "seconds"), [
    ("3", 3.0), (" 0 ", 0.0), ("120", 120.0), ("99999", MAX_RETRY_AFTER_S),
    (None, None), ("", None), ("-1", None), ("1.5", None), ("soon", None), ("٣", None),
])
def test_retry_after_delta_seconds(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_retry_after_http_date() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after(later, now=now) == pytest.approx(7.0)
    earlier = format_datetime(now - timedelta(seconds=7), usegmt=True)
    assert parse_retry_after(earlier, now=now) == 0.0
    assert parse_retry_after("Wed, 01 Jan 2025 13:00:00 GMT", now=now) == MAX_RETRY_AFTER_S


# -- the delays --

def test_delay_without_header_doubles_with_equal_jitter() -> None:
    low, high = Backoff(base_s=0.5, cap_s=4.0, random=lambda: 0.0), \
        Backoff(base_s=0.5, cap_s=4.0, random=lambda: 0.999999)
    assert [low.delay(n) for n in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]
    assert [round(high.delay(n), 3) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert low.delay(10_000) == 2.0  # no overflow on a long run of retries


def test_delay_honours_retry_after_and_spreads_the_herd() -> None:
    policy = Backoff(base_s=0.25, cap_s=10.0, random=lambda: 0.0)
    assert policy.delay(0, 1.0) == 1.0  # never shorter than asked
    spread = Backoff(base_s=0.25, cap_s=10.0, random=lambda: 0.999999)
    assert 1.0 < spread.delay(0, 1.0) <= 1.25  # plus at most one step
    assert 1.0 < spread.delay(5, 1.0) <= 2.0  # and never more than the header again
    assert spread.delay(0, 0.0) <= 0.25  # Retry-After: 0 still jitters a little


def test_deadline() -> None:
    clock = Clock()
    deadline = Deadline(10.0, clock=clock)
    assert deadline.allows(9.9) and not deadline.allows(10.0)
    clock.now += 8
    assert deadline.remaining == pytest.approx(2.0)
    assert deadline.cap(60.0) == pytest.approx(2.0)
    clock.now += 5
    assert deadline.expired and deadline.cap(60.0) == 0.5
    assert Deadline(None, clock=clock).allows(1e9)


# -- the retry loop --

def _api(handler: Callable[[httpx.Request], httpx.Response], clock: Clock,
         deadline_s: float | None = 30.0) -> NodeApi:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://node/")
    policy = RetryPolicy(Backoff(base_s=0.25, cap_s=4.0, random=lambda: 0.5), deadline_s)
    api = NodeApi(http, policy, sleep=clock.sleep)
    api.deadline = lambda: Deadline(deadline_s, clock=clock)  # type: ignore[method-assign]
    return api


async def test_429s_are_waited_out_with_retry_after() -> None:
    clock, seen = Clock(), []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("idempotency-key"))
        if len(seen) < 4:
            return httpx.Response(429, headers={"Retry-After": "2"},
                                  json={"code": 429, "message": "busy"})
        return httpx.Response(201, json={"sandboxID": "x"})

    api = _api(handler, clock)
    response = await api.request("POST", "v2/sandboxes", what="create", idempotent=False,
                                 headers={"Idempotency-Key": "k1"})
    assert response.status_code == 201
    assert seen == ["k1"] * 4  # the same key on every retry
    assert clock.slept == [2.125, 2.25, 2.5]  # the header, plus half a growing step


async def test_429s_past_the_deadline_are_a_capacity_error() -> None:
    clock = Clock()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "3"},
                              json={"code": 429, "message": "node busy"})

    api = _api(handler, clock, deadline_s=10.0)
    with pytest.raises(CapacityError) as caught:
        await api.request("POST", "v2/sandboxes", what="create", idempotent=True)
    # 3 waits of ~3 s fit in 10 s, a fourth would not: it is not taken.
    assert len(clock.slept) == 3 and clock.now - 1000.0 < 10.0
    assert caught.value.retry_after_s == 3.0 and caught.value.infrastructure
    assert "node busy" in str(caught.value) and "gave up after 4 attempts" in str(caught.value)


async def test_503_is_retried_only_when_idempotent() -> None:
    clock, calls = Clock(), []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            return httpx.Response(503, json={"code": 503, "message": "restarting"})
        return httpx.Response(204)

    assert (await _api(handler, clock).request("DELETE", "sandboxes/x", what="kill",
                                               idempotent=True)).status_code == 204
    calls.clear()
    with pytest.raises(Unavailable):
        await _api(handler, clock).request("POST", "sandboxes/x/pause", what="pause",
                                           idempotent=False)
    assert calls == ["POST"]


async def test_transport_errors() -> None:
    clock, calls = Clock(), []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("refused", request=request)  # never sent: always retried
        if len(calls) == 2:
            raise httpx.ReadError("reset", request=request)  # maybe acted on
        return httpx.Response(200, json=[])

    assert (await _api(handler, clock).request("GET", "v2/sandboxes", what="list",
                                               idempotent=True)).status_code == 200
    calls.clear()
    with pytest.raises(Unavailable) as caught:
        await _api(handler, clock).request("POST", "sandboxes/x/fork", what="fork",
                                           idempotent=False)
    assert len(calls) == 2 and isinstance(caught.value.__cause__, httpx.ReadError)


async def test_conversion_of_other_statuses() -> None:
    clock = Clock()

    def handler(request: httpx.Request) -> httpx.Response:
        status = int(request.url.path.rsplit("/", 1)[1])
        return httpx.Response(status, json={"code": status, "message": "nope"})

    api = _api(handler, clock)
    with pytest.raises(SandboxLost) as lost:
        await api.request("GET", "s/404", what="get", idempotent=True, sandbox_id="sb1")
    assert lost.value.sandbox_id == "sb1" and lost.value.status == 404
    with pytest.raises(Conflict):
        await api.request("GET", "s/409", what="get", idempotent=True)
    assert clock.slept == []  # neither is retried
