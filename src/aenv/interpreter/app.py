"""The HTTP routes of the code interpreter, with the statuses the SDKs map.

    GET    /health                   200 once the default Python kernel is alive, else 503
    POST   /execute                  200 and NDJSON lines (results.py), or an error status
    POST   /contexts                 200 {id, language, cwd}
    GET    /contexts                 200 [{id, language, cwd}, ...]
    POST   /contexts/{id}/restart    204
    DELETE /contexts/{id}            204

Errors are plain text, the SDK shows the body: 404 for an unknown context (the SDK raises
NotFoundException), 400 for a request it cannot honour (an unknown or uninstalled language,
both a context and a language, bad env var names, a cwd that is no directory), 500 when a
kernel fails to start. The access-token headers are not checked here: the node's proxy has
checked them before a request reaches the sandbox.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from aenv.interpreter import envvars
from aenv.interpreter.contexts import BadRequest, ContextNotFound, Contexts
from aenv.interpreter.kernel import KernelError
from aenv.interpreter.streaming import ExecutionResponse

log = logging.getLogger(__name__)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value or None
    raise BadRequest(f"{key} must be a string")


def _env(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{key} must be an object of strings")
    try:
        return envvars.validate(value)
    except envvars.EnvVarError as exc:
        raise BadRequest(str(exc)) from exc


def _contexts(request: Request) -> Contexts:
    contexts: Contexts = request.app.state.contexts
    return contexts


async def health(request: Request) -> Response:
    if await _contexts(request).ready():
        return PlainTextResponse("OK")
    return PlainTextResponse("the default kernel is not running", status_code=503)


async def execute(request: Request) -> Response:
    body = await _json_body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequest("code must be a string")
    context_id = _optional_str(body, "context_id")
    language = _optional_str(body, "language")
    env = _env(body, "env_vars")
    if context_id and language:
        raise BadRequest("only one of context_id or language can be provided")
    contexts = _contexts(request)
    context = contexts.get(context_id) if context_id else await contexts.default(language)
    return ExecutionResponse(context.kernel.execute(code, env))  # type: ignore[return-value]


async def create_context(request: Request) -> Response:
    body = await _json_body(request)
    # `env_vars` as /execute names them; `envs` as the SDKs name them in their own options.
    env = _env(body, "env_vars") or _env(body, "envs")
    context = await _contexts(request).create(
        _optional_str(body, "language"), _optional_str(body, "cwd"), env)
    return JSONResponse(context.describe())


async def list_contexts(request: Request) -> Response:
    return JSONResponse([c.describe() for c in _contexts(request).list()])


async def restart_context(request: Request) -> Response:
    await _contexts(request).restart(request.path_params["context_id"])
    return Response(status_code=204)


async def remove_context(request: Request) -> Response:
    await _contexts(request).remove(request.path_params["context_id"])
    return Response(status_code=204)


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=404)


async def _bad_request(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=400)


async def _kernel_failed(request: Request, exc: Exception) -> Response:
    log.error("%s", exc)
    return PlainTextResponse(str(exc), status_code=500)


def create_app(default_cwd: str) -> ASGIApp:
    """The ASGI app; its lifespan starts the default Python kernel and stops every kernel."""
    contexts = Contexts(default_cwd)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.contexts = contexts
        await contexts.start()
        log.info("code interpreter ready (default cwd %s)", default_cwd)
        try:
            yield
        finally:
            await contexts.stop()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/execute", execute, methods=["POST"]),
        Route("/contexts", create_context, methods=["POST"]),
        Route("/contexts", list_contexts, methods=["GET"]),
        Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
        Route("/contexts/{context_id}", remove_context, methods=["DELETE"]),
    ]
    handlers = {ContextNotFound: _not_found, BadRequest: _bad_request,
                KernelError: _kernel_failed}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
