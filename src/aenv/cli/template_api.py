"""The node's template-build API as the CLI uses it: E2B's routes plus aenv's Dockerfile body.

* ``POST /v3/templates`` → a template id and a build id;
* ``GET /templates/{id}/files/{hash}`` → is the context there; if not, ``PUT`` it to the url
  given (relative to the API URL, or absolute) with the headers given;
* ``POST /v2/templates/{id}/builds/{build}`` with ``{"dockerfile", "contextHash", "buildArgs",
  "target"?, "force"}`` (aenv) or ``{"fromImage", "steps": [], "force", "fromImageRegistry"?}``
  (E2B);
* ``GET /templates/{id}/builds/{build}/status?logsOffset=N&limit=100``, polled;
* ``GET /templates``, ``DELETE /templates/{id}``.

Foreign errors convert here, once: a transport failure is :class:`Unavailable`, an HTTP error
status the :class:`AenvError` of that status with the node's ``message``, a body that is not
what the contract says :class:`Internal`. Replies are parsed into closed dataclasses.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from aenv.core.errors import (
    AenvError,
    AlreadyExists,
    Conflict,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

#: One API call: the node answers in milliseconds; 30 s leaves room for a node under load.
API_TIMEOUT_S = 30.0
#: The context upload: a large context over a slow link (the E2B SDK allows the same hour).
UPLOAD_TIMEOUT_S = 3600.0
#: How often a build's status is polled (the E2B SDK's interval).
POLL_INTERVAL_S = 0.2
#: Log entries asked for per poll (the SDK's page size).
LOG_PAGE = 100

_BY_STATUS: dict[int, type[AenvError]] = {
    400: InvalidArgument, 401: Unauthenticated, 403: PermissionDenied, 404: NotFound,
    409: Conflict, 429: ResourceExhausted, 503: Unavailable,
}


@dataclass(frozen=True)
class CreatedBuild:
    template_id: str
    build_id: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class UploadLink:
    present: bool
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LogEntry:
    timestamp: str
    level: str
    message: str
    step: str | None = None


@dataclass(frozen=True)
class BuildStatus:
    status: str  # building | waiting | ready | error
    entries: tuple[LogEntry, ...]
    reason: str | None = None
    reason_step: str | None = None

    @property
    def done(self) -> bool:
        return self.status in ("ready", "error")


def _path(value: str) -> str:
    return quote(value, safe="")


class TemplateApi:
    """One node's template API over an open ``httpx.AsyncClient`` (base URL and key set)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, api_key: str | None) -> AsyncIterator[TemplateApi]:
        headers = {"X-API-KEY": api_key} if api_key else {}
        async with httpx.AsyncClient(base_url=url.rstrip("/") + "/", headers=headers,
                                     timeout=API_TIMEOUT_S) as client:
            yield cls(client)

    # -- calls --

    async def create(self, name: str, cpu_count: int | None, memory_mb: int | None
                     ) -> CreatedBuild:
        body: dict[str, Any] = {"name": name}
        if cpu_count is not None:
            body["cpuCount"] = cpu_count
        if memory_mb is not None:
            body["memoryMB"] = memory_mb
        reply = await self._json("POST", "v3/templates", json=body)
        return CreatedBuild(_str(reply, "templateID"), _str(reply, "buildID"),
                            tuple(str(n) for n in reply.get("names") or ()))

    async def upload_link(self, template_id: str, files_hash: str) -> UploadLink:
        reply = await self._json("GET", f"templates/{_path(template_id)}/files/{files_hash}")
        present = reply.get("present")
        if not isinstance(present, bool):
            raise Internal(f"unexpected answer from the node (no 'present'): {reply!r}")
        url = reply.get("url")
        headers = reply.get("headers") or {}
        if not present and not isinstance(url, str):
            raise Internal("the node wants the build context but gave no upload url")
        return UploadLink(present, url if isinstance(url, str) else None,
                          {str(k): str(v) for k, v in dict(headers).items()})

    async def upload(self, link: UploadLink, body: AsyncIterable[bytes], size: int) -> None:
        """PUT the context; the API key goes along only to the API's own origin."""
        assert link.url is not None
        headers = {k: v for k, v in link.headers.items() if k.lower() != "content-length"}
        headers["Content-Length"] = str(size)  # explicit: no chunked encoding (presigned URLs)
        base = self.client.base_url
        if "://" in link.url:
            target = httpx.URL(link.url)
            same_origin = (target.scheme, target.host, target.port) == (
                base.scheme, base.host, base.port)
        else:
            same_origin = True  # relative to the API URL, as httpx merges it with base_url
        if same_origin:
            request = self.client.build_request("PUT", link.url, headers=headers, content=body)
        else:  # built outside the client: none of its default headers (the API key) go along
            request = httpx.Request("PUT", link.url, headers=headers, content=body)
        request.extensions["timeout"] = httpx.Timeout(UPLOAD_TIMEOUT_S).as_dict()
        await self._send(request, what="upload of the build context")

    async def start_build(self, template_id: str, build_id: str, body: dict[str, Any]) -> None:
        await self._send(self.client.build_request(
            "POST", f"v2/templates/{_path(template_id)}/builds/{_path(build_id)}", json=body))

    async def status(self, template_id: str, build_id: str, offset: int) -> BuildStatus:
        reply = await self._json(
            "GET", f"templates/{_path(template_id)}/builds/{_path(build_id)}/status",
            params={"logsOffset": offset, "limit": LOG_PAGE})
        entries = []
        for raw in reply.get("logEntries") or ():
            if not isinstance(raw, dict):
                raise Internal(f"unexpected log entry from the node: {raw!r}")
            step = raw.get("step")
            entries.append(LogEntry(str(raw.get("timestamp", "")), str(raw.get("level", "info")),
                                    str(raw.get("message", "")),
                                    None if step is None else str(step)))
        reason = reply.get("reason") if isinstance(reply.get("reason"), dict) else {}
        assert isinstance(reason, dict)
        message, step = reason.get("message"), reason.get("step")
        return BuildStatus(_str(reply, "status"), tuple(entries),
                           None if message is None else str(message),
                           None if step is None else str(step))

    async def list(self) -> list[dict[str, Any]]:
        response = await self._send(self.client.build_request("GET", "templates"))
        reply = _decode(response)
        if not isinstance(reply, list) or not all(isinstance(t, dict) for t in reply):
            raise Internal(f"unexpected answer from the node to GET /templates: {reply!r}"[:300])
        return reply

    async def delete(self, template_id: str) -> None:
        await self._send(self.client.build_request("DELETE", f"templates/{_path(template_id)}"))

    # -- the one conversion boundary --

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        response = await self._send(self.client.build_request(method, path, **kw))
        reply = _decode(response)
        if not isinstance(reply, dict):
            raise Internal(f"unexpected answer from the node to {method} /{path}: {reply!r}"[:300])
        return reply

    async def _send(self, request: httpx.Request, *, what: str | None = None) -> httpx.Response:
        what = what or f"{request.method} {request.url.path}"
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        try:
            response = await self.client.send(request)
        except httpx.ConnectError as exc:
            raise Unavailable(f"cannot reach {origin}: {transport_reason(exc)}") from exc
        except httpx.TimeoutException as exc:
            raise Unavailable(f"{what}: {origin} did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise Unavailable(f"{what}: {transport_reason(exc)}") from exc
        if response.status_code >= 400:
            raise http_error(response, what)
        return response


def transport_reason(exc: Exception) -> str:
    """The root cause, in words: httpx wraps the socket's error a few levels deep."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (is the node running? see --url / E2B_API_URL)"
        if isinstance(cause, socket.gaierror):
            return f"unknown host ({cause.strerror})"
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def http_error(response: httpx.Response, what: str) -> AenvError:
    try:
        body = response.json()
        message = str(body.get("message")) if isinstance(body, dict) else response.text
    except ValueError:
        message = response.text
    message = " ".join(message.split())[:500] or response.reason_phrase
    status = response.status_code
    cls = _BY_STATUS.get(status, Internal if status >= 500 else InvalidArgument)
    if status == 401:
        message += " (set --api-key or E2B_API_KEY)"
    if status == 409 and "exist" in message:
        cls = AlreadyExists
    return cls(f"{what}: {status} {message}")


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise Internal(f"the node answered {response.request.method} "
                       f"{response.request.url.path} with no JSON: {response.text[:200]!r}"
                       ) from None


def _str(reply: Mapping[str, Any], key: str) -> str:
    value = reply.get(key)
    if not isinstance(value, str) or not value:
        raise Internal(f"unexpected answer from the node (no {key!r}): {dict(reply)!r}"[:300])
    return value
