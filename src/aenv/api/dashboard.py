"""The web dashboard's static files (``aenv/dashboard/``; docs/dashboard.md).

``GET /dashboard`` and ``/dashboard/`` answer the page, ``GET /dashboard/{name}`` one of the
package's files (its page, script and style sheet; anything else is a 404 with E2B's error
body). No key is asked for: the files hold nothing of the node's, and the page signs in by
itself, sending the key as ``X-API-KEY`` on each API call it makes (never in a URL). Each
answer carries a strict ``Content-Security-Policy`` (the page's own origin only: no inline
script or style, no remote anything, no framing), ``X-Content-Type-Options: nosniff`` and
``Cache-Control: no-cache``. The routes stay out of the OpenAPI document: they are not E2B's.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, Response

from aenv.core.errors import NotFound

router = APIRouter(include_in_schema=False)

#: The package's files served, by name, with their media types.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
CSP = ("default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
       "script-src 'self'; frame-ancestors 'none'")
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("aenv.dashboard").joinpath(name).read_bytes()


def _file(name: str) -> Response:
    media_type = FILES.get(name)
    if media_type is None:
        raise NotFound(f"dashboard file {name} not found")
    return Response(_read(name), media_type=media_type, headers=HEADERS)


@router.get("/dashboard")
@router.get("/dashboard/")
async def page() -> Response:
    return _file("index.html")


@router.get("/dashboard/{name}")
async def asset(name: str) -> Response:
    return _file(name)
