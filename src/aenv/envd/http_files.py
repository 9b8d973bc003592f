"""``GET /files`` (download), and what it shares with ``POST /files`` (``http_upload``):
request identity, access checks, error rendering (§4.1.2-4).

A download streams: it is read in large chunks in a worker thread while the previous chunk is
being sent; no file is held in memory.

Access is checked here, not in the app: ``/files`` accepts the ``X-Access-Token`` header *or* a
signed URL (:mod:`aenv.envd.signing`). Errors are domain errors rendered as envd's
``{"code": <status>, "message": ...}``.
"""

from __future__ import annotations

import asyncio
import email.utils
import mimetypes
import os
import posixpath
import re
import stat
import zlib
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from aenv.core.errors import AenvError, InvalidArgument, NotFound
from aenv.envd.filesystem.creds import as_user
from aenv.envd.filesystem.entry import (
    os_failure,
)
from aenv.envd.http_misc import error_response
from aenv.envd.signing import check_file_access
from aenv.envd.state import EnvdState
from aenv.envd.users import User, lookup_user, resolve_path

#: Read/write unit: large enough that per-chunk overhead (a thread hop, an ASGI send) is noise
#: next to copying the bytes, small enough to keep memory per transfer low.
CHUNK = 1 << 20
#: Go's gzip.DefaultCompression, which envd uses.
GZIP_LEVEL = 6
#: Downloads up to this size are read whole before the answer (see ``_file_response``).
SMALL_FILE = 1 << 20
_METADATA_HEADER = "x-metadata-"
#: HTTP token characters: what the SDK allows in metadata keys, and a bare filename may hold.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def _state(request: Request) -> EnvdState:
    state: EnvdState = request.app.state.envd
    return state


def _user(request: Request, state: EnvdState) -> User:
    return lookup_user(request.query_params.get("username") or state.default_user)


def _rendered(exc: AenvError) -> Response:
    return error_response(exc.http_status, exc.message)


# -- download ---------------------------------------------------------------------------------


async def download(request: Request) -> Response:
    state = _state(request)
    try:
        check_file_access(state, "read", request.headers, request.query_params)
        user = _user(request, state)
        path = resolve_path(request.query_params.get("path", ""), user, state.default_workdir)
        fd, st = await as_user(user, _open_for_read, path)
    except AenvError as exc:
        return _rendered(exc)
    try:
        return _file_response(request, path, fd, st)
    except BaseException:
        os.close(fd)
        raise


def _open_for_read(path: str) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading; run as the requesting user, so the open is their permission
    check, through every symlink.

    On failure: :class:`NotFound`, :class:`PermissionDenied`, or :class:`InvalidArgument` for
    anything but a file.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        error = os_failure(exc, f"path '{path}'")
        if isinstance(error, NotFound):
            error = NotFound(f"path '{path}' does not exist")
        raise error from exc
    if stat.S_ISDIR(st.st_mode):
        raise InvalidArgument(f"path '{path}' is a directory")
    if not stat.S_ISREG(st.st_mode):
        # A fifo would block the reader forever, a device would never end.
        raise InvalidArgument(f"path '{path}' is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise os_failure(exc, f"opening '{path}'") from exc
    return fd, os.fstat(fd)


def _file_response(request: Request, path: str, fd: int, st: os.stat_result) -> Response:
    size = st.st_size
    headers = {
        "content-type": mimetypes.guess_type(path)[0] or "application/octet-stream",
        "content-disposition": _inline_disposition(posixpath.basename(path)),
        "last-modified": email.utils.formatdate(st.st_mtime, usegmt=True),
        "accept-ranges": "bytes",
        "vary": "Accept-Encoding",
    }
    range_header = request.headers.get("range")
    if range_header and size > 0:
        span = _parse_range(range_header, size)
        if span is None:
            os.close(fd)
            response = error_response(416, "invalid range")
            response.headers["content-range"] = f"bytes */{size}"
            return response
        if span != (0, size):
            start, end = span
            headers["content-range"] = f"bytes {start}-{end - 1}/{size}"
            headers["content-length"] = str(end - start)
            return _FileStream(fd, start, end - start, headers, status=206, gzip=False)
    # Range and conditional requests stay uncompressed, as in envd.
    if not range_header and _wants_gzip(request.headers.get("accept-encoding", "")):
        headers["content-encoding"] = "gzip"
        return _FileStream(fd, 0, size, headers, status=200, gzip=True)
    if size <= SMALL_FILE:
        # Read whole, then answer with what was read: a small file rewritten while it is read
        # (a status file a loop refreshes) gives its bytes of one moment, not a short body
        # under a longer Content-Length.
        data = _read_small(fd)
        if data is not None:
            headers["content-length"] = str(len(data))
            return Response(data, status_code=200, headers=headers)
    headers["content-length"] = str(size)
    return _FileStream(fd, 0, size, headers, status=200, gzip=False)


def _read_small(fd: int) -> bytes | None:
    """All of ``fd`` (closed afterwards) if it holds at most ``2 * SMALL_FILE`` bytes now; else
    ``None`` with ``fd`` rewound and left open for streaming."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.pread(fd, SMALL_FILE, total)
        if not chunk:
            os.close(fd)
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > 2 * SMALL_FILE:
            return None


def _wants_gzip(accept_encoding: str) -> bool:
    """Whether to gzip a download.

    Accept-Encoding is advisory (RFC 9110 §12.5.3). A client that asks for gzip *specifically*
    (the SDK's ``gzip=True`` sends exactly ``gzip``) gets it; a generic default listing several
    codings (httpx's ``gzip, deflate``, which the SDK sends for every plain read; browsers'
    lists) gets identity, because compressing a local transfer only costs throughput.
    """
    offered: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if coding.strip():
            offered[coding.strip().lower()] = quality
    if offered.get("gzip", 0.0) <= 0:
        return offered.get("identity", 1.0) == 0 and offered.get("*", 0.0) > 0
    if offered.get("identity", 1.0) == 0:
        return True
    others = [c for c, q in offered.items() if q > 0 and c not in ("gzip", "x-gzip", "identity")]
    return not others


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The one ``[start, end)`` a ``bytes=`` Range asks for; ``(0, size)`` when it is to be
    ignored (several ranges, another unit); ``None`` when it cannot be satisfied."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return (0, size)
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0:
                return None
            return (max(size - suffix, 0), size)
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start < 0 or start >= size or end <= start:
        return None
    return (start, min(end, size))


def _inline_disposition(name: str) -> str:
    """``inline; filename=…`` formatted like Go's ``mime.FormatMediaType``."""
    if _TOKEN.fullmatch(name):
        return f"inline; filename={name}"
    if name.isascii() and name.isprintable():
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'inline; filename="{escaped}"'
    encoded = quote(name.encode("utf-8", "surrogateescape"), safe="!#$&+-.^_`|~")
    return f"inline; filename*=utf-8''{encoded}"


class _FileStream(Response):
    """Sends ``length`` bytes of ``fd`` from ``offset``, read ahead one chunk in a thread."""

    def __init__(
        self, fd: int, offset: int, length: int, headers: dict[str, str], *, status: int,
        gzip: bool,
    ) -> None:
        super().__init__(status_code=status, headers=headers)
        if "content-length" not in headers:
            del self.headers["content-length"]  # Starlette assumed an empty body; gzip is chunked
        self.fd, self.offset, self.length = fd, offset, length
        self.compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS) \
            if gzip else None

    def _read(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) < size:
            # The file shrank under us: the promised length cannot be honoured; the server
            # drops the connection rather than send a short body as if it were complete.
            raise OSError(f"file changed size while being sent (read {len(data)} of {size})")
        if self.compressor is not None:
            data = self.compressor.compress(data)
        return data

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch_disconnect())
        ahead: asyncio.Future[bytes] | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            offset, end = self.offset, self.offset + self.length
            if offset < end:
                ahead = asyncio.ensure_future(
                    asyncio.to_thread(self._read, offset, min(CHUNK, end - offset)))
            while ahead is not None and not gone.is_set():
                chunk = await ahead
                offset += min(CHUNK, end - offset)
                ahead = None
                if offset < end:
                    ahead = asyncio.ensure_future(
                        asyncio.to_thread(self._read, offset, min(CHUNK, end - offset)))
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if gone.is_set():
                return
            tail = self.compressor.flush() if self.compressor is not None else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            watcher.cancel()
            if ahead is not None:
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)
            os.close(self.fd)


