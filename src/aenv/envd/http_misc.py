"""envd's small plain-HTTP endpoints: ``/health``, ``/restored``, ``/init``, ``/envs``,
``/metrics``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from aenv.envd import bootid, trust_store
from aenv.envd.eventloop import after_restore
from aenv.envd.state import EnvdState
from aenv.envd.sysmetrics import CpuSampler, snapshot
from aenv.envd.volume_binds import SlotBind


def error_response(status: int, message: str) -> JSONResponse:
    """E2B's envd error body: the integer status repeated as ``code``."""
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def health(request: Request) -> Response:
    return Response(status_code=204)


async def restored(request: Request) -> Response:
    """The node's readiness probe after a restore: health, plus a fresh epoll (eventloop.py)."""
    after_restore()
    return Response(status_code=204)


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{name} must be an object of strings")
    return dict(value)


async def init(request: Request) -> Response:
    """Set the access token, sandbox env vars and default user/workdir (orchestrator only).

    ``renewBootId`` (aenv's, not E2B's): this envd now serves a new sandbox, not the one its
    memory image was saved from, so it gets a boot id of its own (``bootid.py``).
    ``volumeMounts`` (aenv's): ``[{slot, path, readOnly}]``, the volume slots to bind where
    the sandbox's volumes belong (``volume_binds.py``). ``trustCertificates`` (aenv's): PEM
    CAs the sandbox's clients are to trust (``trust_store.py``).
    """
    state: EnvdState = request.app.state.envd
    try:
        body = json.loads(await request.body() or b"{}")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        env_vars = _string_map(body.get("envVars"), "envVars")
        token = body.get("accessToken")
        user = body.get("defaultUser")
        workdir = body.get("defaultWorkdir")
        for name, value in (("accessToken", token), ("defaultUser", user),
                            ("defaultWorkdir", workdir)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string")
        renew_boot_id = body.get("renewBootId", False)
        if not isinstance(renew_boot_id, bool):
            raise ValueError("renewBootId must be a boolean")
        raw_mounts = body.get("volumeMounts") or []
        if not isinstance(raw_mounts, list):
            raise ValueError("volumeMounts must be a list")
        mounts = [SlotBind.parse(m) for m in raw_mounts]
        trusted = trust_store.parse(body.get("trustCertificates"))
    except ValueError as exc:
        return error_response(400, f"invalid init request: {exc}")
    # Once a token is set, only its holder may change the sandbox's identity.
    if state.access_token is not None and not state.token_matches(
        request.headers.get("x-access-token")
    ) and token != state.access_token:
        return error_response(401, "unauthorized access, please provide a valid access token")
    if token is not None:
        state.access_token = token or None
    if env_vars:
        state.env_vars.update(env_vars)
    if user:
        state.default_user = user
    if workdir:
        state.default_workdir = workdir
    if mounts:
        try:
            state.volume_binds.apply(mounts)
        except ValueError as exc:
            return error_response(400, f"cannot mount a volume: {exc}")
        except OSError as exc:
            return error_response(500, f"cannot mount a volume: {exc}")
    if trusted:
        try:
            state.env_vars.update(await asyncio.to_thread(trust_store.install, trusted))
        except OSError as exc:
            return error_response(500, f"cannot trust the platform's CA: {exc}")
    if renew_boot_id and state.boot_id_file is not None:
        try:
            bootid.write(state.boot_id_file)
        except OSError as exc:
            return error_response(500, f"cannot renew the boot id: {exc}")
    return Response(status_code=204)


async def envs(request: Request) -> Response:
    state: EnvdState = request.app.state.envd
    return JSONResponse(state.env_vars)


_sampler = CpuSampler()


async def metrics(request: Request) -> Response:
    return JSONResponse(snapshot(_sampler))
