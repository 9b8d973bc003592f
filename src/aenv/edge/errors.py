"""Every error body the API sends: ``{"code": <HTTP status>, "message": ...}`` (e2b-compat §2.2).

The JS SDK branches on the body's ``code``, so it must repeat the HTTP status as an integer.
Routes raise :class:`aenv.core.errors.AenvError` subclasses; nothing builds a body by hand.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aenv.core.errors import AenvError, QuotaExceeded, ResourceExhausted

log = logging.getLogger("aenv.api")

#: Sent with a 429 that is a team's quota, not a node's room: a gateway gives it to the
#: caller as it is, since every node of the cluster would answer the same.
QUOTA_HEADER = "Aenv-Quota-Exceeded"
#: The machine-readable ``error`` of a quota's refusal where a body carries one (the
#: scheduler's answers, a fork's per-child errors).
QUOTA_EXCEEDED = "quota_exceeded"


def error_body(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status,
                        headers=headers)


def error_content(status: int, message: str, **extra: object) -> dict[str, object]:
    """The body itself, for an error that is not a whole answer (one child's entry in a
    fork's answer) or that carries fields of its own besides the two (the scheduler's
    machine-readable ``error``)."""
    return {"code": status, "message": message, **extra}


#: The volume content API (E2B's ``openapi-volumecontent``) answers ``{"code": "<NAME>", ...}``
#: with a *string* code; a status without its own name there is named by this table.
_CONTENT_PATH = "/volumecontent/"
_CONTENT_CODES = {400: "INVALID_REQUEST", 401: "UNAUTHORIZED", 404: "PATH_NOT_FOUND",
                  409: "PATH_ALREADY_EXISTS", 413: "TOO_LARGE", 429: "RATE_LIMITED",
                  503: "UNAVAILABLE", 507: "VOLUME_FULL"}


def _answer(request: Request, status: int, message: str, reason: str | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    if request.url.path.startswith(_CONTENT_PATH):
        code = reason or _CONTENT_CODES.get(status, "INTERNAL_ERROR")
        return JSONResponse({"code": code, "message": message}, status_code=status,
                            headers=headers)
    return error_body(status, message, headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "invalid request: " + "; ".join(parts)


def install(app: FastAPI) -> None:
    @app.exception_handler(AenvError)
    async def _domain(request: Request, exc: AenvError) -> JSONResponse:
        if exc.http_status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        headers: dict[str, str] = {}
        if isinstance(exc, ResourceExhausted) and exc.retry_after_s is not None:
            headers["Retry-After"] = str(exc.retry_after_s)
        if isinstance(exc, QuotaExceeded):
            headers[QUOTA_HEADER] = "1"
        return _answer(request, exc.http_status, exc.message, exc.reason, headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _answer(request, 400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _answer(request, exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _answer(request, 500, f"internal error: {type(exc).__name__}")
