"""The proxy's own error bodies: E2B's, which the SDKs match on (e2b-compat §3.3, §4.1.1).

A dead, paused or unknown sandbox is **502 "...was not found"** (not 404: ``is_running()`` only
returns False on 502), a live sandbox with nothing on the port is 502 "...port is not open".
"""

from __future__ import annotations

from starlette.responses import JSONResponse


def sandbox_not_found(sandbox_id: str) -> JSONResponse:
    return JSONResponse(
        {"sandboxId": sandbox_id, "message": "The sandbox was not found", "code": 502},
        status_code=502,
    )


def port_not_open(sandbox_id: str, port: int) -> JSONResponse:
    return JSONResponse(
        {
            "sandboxId": sandbox_id,
            "message": "The sandbox is running but port is not open",
            "port": port,
            "code": 502,
        },
        status_code=502,
    )


def upstream_broken(sandbox_id: str, port: int, *, close: bool) -> JSONResponse:
    """The guest closed or reset the connection before answering (a server that died, or
    closed mid-upload). ``close``: the request body was not all read, so the client's
    connection cannot carry another request."""
    return JSONResponse(
        {
            "sandboxId": sandbox_id,
            "message": "The sandbox closed the connection before answering",
            "port": port,
            "code": 502,
        },
        status_code=502, headers={"connection": "close"} if close else None,
    )


def traffic_token_refused(sandbox_id: str) -> JSONResponse:
    """A sandbox made with ``allowPublicTraffic: false``, asked without its traffic access
    token (or with another): 403, as E2B's proxy answers."""
    return JSONResponse(
        {"sandboxId": sandbox_id, "code": 403,
         "message": "this sandbox's ports need its traffic access token in the "
                    "e2b-traffic-access-token header"},
        status_code=403,
    )


def bad_target(message: str) -> JSONResponse:
    return JSONResponse({"message": message, "code": 400}, status_code=400)
