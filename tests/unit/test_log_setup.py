"""Logs a pipeline can follow (``core/log_setup.py``, ``edge/request_ids.py``): the request's
id taken from ``X-Request-Id`` (or made, when absent or not one we keep), answered back, and
on every log line of the request, tasks it starts included, as text or as JSON."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from aenv.core import log_setup
from aenv.core.request_id import RequestIdFilter
from aenv.edge.request_ids import RequestIds

pytestmark = pytest.mark.anyio


def _capture(fmt: log_setup.LogFormat) -> io.StringIO:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(log_setup.formatter(fmt))
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("aenv.test.requests")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return out


async def _app_answers(fmt: log_setup.LogFormat, headers: dict[str, str]
                       ) -> tuple[httpx.Response, str]:
    out = _capture(fmt)
    log = logging.getLogger("aenv.test.requests")

    async def work() -> None:
        log.info("in a task the request started")

    async def route(request: Request) -> PlainTextResponse:
        log.info("handling %s", request.url.path)
        await asyncio.create_task(work())
        return PlainTextResponse(request.headers.get("x-request-id", ""))

    app = RequestIds(Starlette(routes=[Route("/x", route)]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        answer = await client.get("/x", headers=headers)
    log.info("after the request")
    return answer, out.getvalue()


async def test_a_callers_id_is_kept_answered_and_logged_as_json() -> None:
    answer, logged = await _app_answers("json", {"X-Request-Id": "trace-123"})
    assert answer.headers["x-request-id"] == "trace-123" == answer.text  # seen by the route
    lines = [json.loads(line) for line in logged.splitlines()]
    assert [line["request_id"] for line in lines] == ["trace-123", "trace-123", None]
    assert lines[0]["message"] == "handling /x" and lines[0]["level"] == "INFO"
    assert {"time", "logger"} <= set(lines[0])


async def test_an_id_is_made_when_none_or_a_bad_one_is_given_and_text_ends_in_it() -> None:
    for given in ({}, {"X-Request-Id": "no spaces or {braces} allowed"}):
        answer, logged = await _app_answers("text", given)
        made = answer.headers["x-request-id"]
        assert len(made) == 32 and made == answer.text
        first, second, after = logged.splitlines()
        assert first.endswith(f"handling /x [request {made}]")
        assert second.endswith(f"[request {made}]") and not after.endswith("]")
