"""``GET/POST /files`` (to be completed)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from aenv.envd.http_misc import error_response


async def download(request: Request) -> Response:
    return error_response(501, "not implemented")


async def upload(request: Request) -> Response:
    return error_response(501, "not implemented")
