"""The node's REST API as the client calls it: one ``httpx.AsyncClient``, retries, conversion.

Every control-plane call of ``aenv.client`` goes through :meth:`NodeApi.request`, so the retry
rules and the error conversion live in one place (the conventions of ``cli/template_api.py``):

* **429** is retried on every call, idempotent or not: the node refused before doing anything
  (admission, ``orchestrator/admission.py``). The wait honours ``Retry-After``
  (``backoff.py``); past the call's deadline the last refusal is a :class:`CapacityError`;
* **502/503/504** and transport errors after the request went out are retried only on
  idempotent calls (GET, DELETE, a create carrying an ``Idempotency-Key``): the node may have
  acted on a request it could not answer. A connect error (nothing was sent) is always retried;
* everything else converts once, here: 401/403 :class:`Unauthenticated`, 404 the caller's
  ``not_found`` (a sandbox we hold → :class:`SandboxLost`), 409 :class:`Conflict`, other 4xx
  :class:`InvalidRequest`, 5xx and transport failures :class:`Unavailable`, each with the
  node's ``message``.

Must not touch envd: commands and files go through the e2b SDK (``sandbox.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from aenv.client.backoff import Backoff, Deadline, parse_retry_after
from aenv.client.errors import (
    CapacityError,
    ClientError,
    Conflict,
    InvalidRequest,
    NotFound,
    SandboxLost,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger("aenv.client")

#: One API call: a node answers in milliseconds, a create waits in its admission queue for a
#: few seconds; 60 s is the E2B SDK's request timeout.
REQUEST_TIMEOUT_S = 60.0
#: The budget of one logical call, retries and their waits included: long enough to wait out a
#: node that is busy for minutes (a burst of creates), short enough that a trainer notices a
#: node that stays full.
DEFAULT_DEADLINE_S = 300.0
_RETRY_UNAVAILABLE = frozenset({502, 503, 504})

NotFoundFactory = Callable[[str], ClientError]


@dataclass(frozen=True)
class RetryPolicy:
    backoff: Backoff = field(default_factory=Backoff)
    #: Per logical call; None: retry for ever (only capacity and transient failures).
    deadline_s: float | None = DEFAULT_DEADLINE_S
    request_timeout_s: float = REQUEST_TIMEOUT_S


class NodeApi:
    """One node's REST API over an open ``httpx.AsyncClient`` (base URL and key set)."""

    def __init__(self, http: httpx.AsyncClient, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.http = http
        self.policy = policy or RetryPolicy()
        self._sleep = sleep

    def deadline(self) -> Deadline:
        return Deadline(self.policy.deadline_s)

    async def request(
        self, method: str, path: str, *, what: str, idempotent: bool,
        json: Any = None, params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None, deadline: Deadline | None = None,
        retry_statuses: Collection[int] = (), sandbox_id: str | None = None,
        not_found: NotFoundFactory | None = None,
    ) -> httpx.Response:
        """Send until answered with < 400 or a status not worth retrying; see the module doc."""
        deadline = deadline or self.deadline()
        attempt = 0
        while True:
            timeout = deadline.cap(self.policy.request_timeout_s)
            try:
                response = await self.http.request(method, path, json=json, params=params,
                                                   headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                failure = Unavailable(f"{what}: {transport_reason(exc, self.http.base_url)}",
                                      sandbox_id=sandbox_id)
                sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if sent and not idempotent:
                    raise failure from exc
                await self._wait(attempt, None, deadline, failure, exc)
                attempt += 1
                continue
            status = response.status_code
            if status < 400:
                return response
            error = http_error(response, what, sandbox_id, not_found)
            retry = (status == 429 or status in retry_statuses
                     or (idempotent and status in _RETRY_UNAVAILABLE))
            if not retry:
                raise error
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            if isinstance(error, CapacityError):
                error.retry_after_s = retry_after
            await self._wait(attempt, retry_after, deadline, error, None)
            attempt += 1

    async def _wait(self, attempt: int, retry_after: float | None, deadline: Deadline,
                    error: ClientError, cause: BaseException | None) -> None:
        delay = self.policy.backoff.delay(attempt, retry_after)
        if not deadline.allows(delay):
            spent = f" (gave up after {attempt + 1} attempts"
            spent += f" in {deadline.seconds:.0f} s)" if deadline.seconds is not None else ")"
            error.message += spent
            error.args = (error.message,)
            raise error from cause
        log.debug("%s; retrying in %.2f s", error.message, delay)
        await self._sleep(delay)


def transport_reason(exc: httpx.TransportError, base: httpx.URL) -> str:
    origin = f"{base.scheme}://{base.netloc.decode()}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{origin} did not answer in time"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return f"cannot reach {origin}: connection refused (is the node running?)"
        cause = cause.__cause__ or cause.__context__
    text = (str(exc) or type(exc).__name__).splitlines()[0]
    return f"cannot reach {origin}: {text}"


def http_error(response: httpx.Response, what: str, sandbox_id: str | None,
                not_found: NotFoundFactory | None) -> ClientError:
    try:
        body = response.json()
        message = str(body.get("message")) if isinstance(body, dict) else response.text
    except ValueError:
        message = response.text
    status = response.status_code
    message = " ".join(message.split())[:500] or response.reason_phrase
    text = f"{what}: {status} {message}"
    if status in (401, 403):
        return Unauthenticated(text + " (set api_key or E2B_API_KEY)", status=status)
    if status == 404:
        if not_found is not None:
            return not_found(text)
        if sandbox_id is not None:
            return SandboxLost(text, status=status, sandbox_id=sandbox_id)
        return NotFound(text, status=status)
    if status == 409:
        return Conflict(text, status=status, sandbox_id=sandbox_id)
    if status == 429:
        return CapacityError(text, sandbox_id=sandbox_id)
    if status >= 500:
        return Unavailable(text, status=status, sandbox_id=sandbox_id)
    return InvalidRequest(text, status=status, sandbox_id=sandbox_id)


def json_of(response: httpx.Response, what: str) -> Any:
    """The body of a successful answer; a node answering non-JSON is :class:`Unavailable`
    (something that is not a node, e.g. a proxy's error page, answered)."""
    try:
        return response.json()
    except ValueError:
        raise Unavailable(f"{what}: the node answered {response.status_code} with no JSON: "
                          f"{response.text[:200]!r}", status=response.status_code) from None
