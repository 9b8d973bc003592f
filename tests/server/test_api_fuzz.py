"""schemathesis against the node's own OpenAPI (``/openapi.json``): generated requests to every
operation of a real node must never get a 5xx, and every error must be an E2B error body
``{"code": <status>, "message": str}``.

Bounded and repeatable: a fixed number of examples per operation, derandomized (the same
requests every run), no shrinking; ~a minute on a quiet machine. Kept safe: the node may run
two sandboxes, and the operations that would leave the machine or stop the node are left out
(``/sandboxes-cold`` pulls the image it is given from its registry; ``/node/drain`` would
refuse every later create).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor]

#: Examples per operation: ~40 operations, so a few hundred requests.
EXAMPLES = 25
_SKIPPED = r"^/(sandboxes-cold|node/drain)$"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(max_sandboxes="2", warm_pool_size="0", max_concurrent_starts="1",
                 max_queued_starts="1") as server:
        yield server


def _check(case: schemathesis.Case) -> None:
    response = case.call(headers={"X-API-KEY": API_KEY}, timeout=60)
    status = response.status_code
    where = f"{case.method} {case.formatted_path} -> {status}: {response.text[:300]}"
    assert status < 500, where
    if status >= 400 and case.method != "HEAD":  # a HEAD answer has no body
        try:
            body = json.loads(response.content)
        except ValueError:
            raise AssertionError(f"not JSON: {where}") from None
        assert isinstance(body, dict) and body.get("code") == status, where
        assert isinstance(body.get("message"), str), where


def test_no_5xx_and_e2b_error_bodies(node: NodeServer) -> None:
    schema = schemathesis.openapi.from_url(f"{node.url}/openapi.json")
    failures: list[str] = []
    operations = 0
    for result in schema.exclude(path_regex=_SKIPPED).get_all_operations():
        operation = result.ok()
        operations += 1
        # Valid requests and invalid ones (wrong types, missing fields, bad headers).
        cases = st.one_of(operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                          operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @given(case=cases)
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case) -> None:
            _check(case)

        try:
            run()
        except AssertionError as exc:  # the first failing example of this operation
            failures.append(str(exc).splitlines()[0])
    assert operations > 30
    assert not failures, "\n".join(failures)
