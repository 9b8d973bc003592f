"""schemathesis against the node's own OpenAPI (``/openapi.json``): generated requests to every
operation of a real node must never get a 5xx, and every error must be an E2B error body
``{"code": <status>, "message": str}`` (the volume content API's, as E2B's, with a string
``code``).

Bounded and repeatable: a fixed number of examples per operation, derandomized (the same
requests every run), no shrinking; ~a minute on a quiet machine. Kept safe: the node may run
two sandboxes, and the operations that would leave the machine or stop the node are left out
(``/sandboxes-cold`` pulls the image it is given from its registry; ``/node/drain`` would
refuse every later create).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from e2b import Sandbox
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


def _aim(case: schemathesis.Case, sandbox_id: str) -> None:
    """Point the case at the live sandbox and the real template, so that the operations run
    on something instead of all answering 404 (a kill excepted: it would end the run's
    sandbox for every later case)."""
    if case.method != "DELETE":
        for name in case.path_parameters or {}:
            if "sandbox" in name.lower():
                case.path_parameters[name] = sandbox_id
    if isinstance(case.body, dict) and "templateID" in case.body:
        case.body["templateID"] = "base"


def _check(case: schemathesis.Case, seen: Counter[str]) -> None:
    response = case.call(headers={"X-API-KEY": API_KEY}, timeout=60)
    status = response.status_code
    seen[f"{status}"] += 1
    where = f"{case.method} {case.formatted_path} -> {status}: {response.text[:300]}"
    assert status < 500, where
    if status >= 400 and case.method != "HEAD":  # a HEAD answer has no body
        try:
            body = json.loads(response.content)
        except ValueError:
            raise AssertionError(f"not JSON: {where}") from None
        if case.path.startswith("/volumecontent/"):
            # E2B's volume content API names its errors: ``{"code": "PATH_NOT_FOUND", ...}``.
            assert isinstance(body, dict) and isinstance(body.get("code"), str), where
            assert body["code"].isupper(), where
        else:
            assert isinstance(body, dict) and body.get("code") == status, where
        assert isinstance(body.get("message"), str), where


@pytest.fixture(scope="module")
def live(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=600)
    try:
        yield sbx
    finally:
        with contextlib.suppress(Exception):
            sbx.kill()


def test_no_5xx_and_e2b_error_bodies(node: NodeServer, live: Sandbox) -> None:
    schema = schemathesis.openapi.from_url(f"{node.url}/openapi.json")
    failures: list[str] = []
    seen: Counter[str] = Counter()
    operations = 0
    for result in schema.exclude(path_regex=_SKIPPED).get_all_operations():
        operation = result.ok()
        operations += 1
        # Valid requests and invalid ones (wrong types, missing fields, bad headers).
        cases = st.one_of(operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                          operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))

        @given(case=cases, aimed=st.booleans())
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case, aimed: bool) -> None:
            if aimed:
                _aim(case, live.sandbox_id)
            _check(case, seen)

        try:
            run()
        except AssertionError as exc:  # the first failing example of this operation
            failures.append(str(exc).splitlines()[0])
    print(f"{operations} operations, {seen.total()} requests, by status: {dict(seen)}")
    assert operations > 30
    assert not failures, "\n".join(failures)


#: Requests no schema describes, which uvicorn used to answer in plain text.
_MALFORMED = [
    b"GET /health HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: a\r\nX-Nul: a\x00b\r\n\r\n",
    b"G\x01T /health HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /health HTTP/9.9\r\nHost: a\r\n\r\n",
    b"POST /v2/sandboxes HTTP/1.1\r\nHost: a\r\nContent-Length: 12x\r\n\r\n",
    b"POST /v2/sandboxes HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v2/sandboxes HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]


def test_malformed_http_gets_e2b_error_bodies(node: NodeServer) -> None:
    for raw in _MALFORMED:
        with socket.create_connection((node.host, node.port), timeout=10) as sock:
            sock.sendall(raw)
            answer = b""
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while data := sock.recv(65_536):
                    answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        assert 400 <= status < 500, (raw, answer[:300])
        parsed = json.loads(body)
        assert parsed["code"] == status and isinstance(parsed["message"], str), (raw, body)
