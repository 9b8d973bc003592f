"""50 concurrent creates through ``aenv.client`` against a node at a small admission limit:
the node answers most of them 429 with ``Retry-After``; every create still completes by
backing off, and then all are killed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from aenv.client import AsyncClient
from tests.client.conftest import labelled
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(600)]

CREATES = 50
#: Two starting, four waiting: the other 44 of a burst are refused at once.
LIMITS = {"max_concurrent_starts": "2", "max_queued_starts": "4", "busy_retry_after_s": "1",
          "warm_pool_size": "0"}


@pytest.fixture(scope="module")
def small_node() -> Iterator[NodeServer]:
    with serving(**LIMITS) as server:
        yield server


class Refusals(logging.Handler):
    """Counts the client's retries of a 429 (its debug log names each)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if " 429 " in record.getMessage():
            self.count += 1


async def test_fifty_concurrent_creates_all_complete_by_backing_off(
        small_node: NodeServer) -> None:
    refusals = Refusals()
    logger = logging.getLogger("aenv.client")
    logger.addHandler(refusals)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    started = time.monotonic()
    try:
        async with AsyncClient(small_node.url, API_KEY, max_concurrent_creates=CREATES,
                               deadline_s=400) as client:
            sandboxes = await asyncio.gather(*(client.create(timeout=300)
                                               for _ in range(CREATES)))
            created_s = time.monotonic() - started
            ids = {s.sandbox_id for s in sandboxes}
            assert len(ids) == CREATES
            assert set(labelled(small_node, run=client.run_id)) == ids
            results = await asyncio.gather(*(s.run("echo ok") for s in sandboxes[:5]))
            assert all(r.stdout == "ok\n" for r in results)
            killed = await client.kill_by_metadata(run=client.run_id)
            assert sorted(killed) == sorted(ids)
            assert labelled(small_node, run=client.run_id) == []
    finally:
        logger.removeHandler(refusals)
        logger.setLevel(old_level)
    print(f"\n{CREATES} creates in {created_s:.1f} s through {refusals.count} refusals (429)")
    assert refusals.count >= CREATES - 6, "the node's limit was never hit"
