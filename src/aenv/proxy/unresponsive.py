"""Requests to the envd of a sandbox whose envd does not answer fail at once.

``orchestrator/liveness.py`` keeps the verdict. Without this, a proxied SDK request to a stuck
envd (e.g. ptrace-stopped by root in the sandbox) connects — the guest's network stack is the
sentry's and still accepts — and hangs until the client gives up. The answer is E2B's 502
shape; its message says neither "was not found" nor "port is not open", so the SDKs raise
instead of calling the sandbox gone or the port closed. Only envd's port: the guest's other
servers may well be answering, and a request to one that is not fails on its own (connect
timeout, ``network/guest_http.py``).
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from aenv.orchestrator.liveness import Liveness
from aenv.runtime.base import ENVD_PORT


def refusal(liveness: Liveness, sandbox_id: str, port: int) -> JSONResponse | None:
    """The 502 to answer instead of forwarding, or None to forward."""
    if port != ENVD_PORT:
        return None
    verdict = liveness.verdict(sandbox_id)
    if verdict is None:
        return None
    return JSONResponse(
        {
            "sandboxId": sandbox_id,
            "message": f"The sandbox is running but its envd is not responding: {verdict.reason}",
            "code": 502,
        },
        status_code=502,
    )
