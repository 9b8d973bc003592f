"""``POST /files`` (upload), as E2B's envd serves it (§4.1.3).

An upload is parsed as it arrives (multipart with python-multipart's push parser, or a raw
``application/octet-stream`` body, either optionally gzip-encoded) and written straight to its
destination: nothing is spooled to a temporary file and no file is held in memory. Access and
error rendering are shared with the download side (:mod:`aenv.envd.http_files`).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from aenv.core.errors import AenvError, InvalidArgument
from aenv.envd.filesystem.creds import as_user
from aenv.envd.filesystem.entry import (
    create_or_truncate,
    ensure_dirs,
    os_failure,
    wire_str,
    write_metadata,
)
from aenv.envd.filesystem.watch import WatcherRegistry
from aenv.envd.http_files import (
    _METADATA_HEADER,
    _PRINTABLE,
    _TOKEN,
    CHUNK,
    _rendered,
    _state,
    _user,
)
from aenv.envd.http_misc import error_response
from aenv.envd.signing import check_file_access
from aenv.envd.state import EnvdState
from aenv.envd.users import User, resolve_path


async def upload(request: Request) -> Response:
    state = _state(request)
    watchers: WatcherRegistry = request.app.state.watchers
    try:
        check_file_access(state, "write", request.headers, request.query_params)
        user = _user(request, state)
        metadata = _metadata(request)
        media, params = parse_options_header(request.headers.get("content-type", ""))
        body = _decoded_body(request)
        upload = _Upload(state, user, metadata, watchers, request.query_params.get("path"))
        if media == b"application/octet-stream":
            await upload.raw(body)
        elif media.startswith(b"multipart/"):
            boundary = params.get(b"boundary")
            if not boundary:
                raise InvalidArgument("multipart body without a boundary")
            await upload.multipart(body, boundary)
        else:
            raise InvalidArgument(
                f"unsupported content type: {media.decode('latin-1')!r}, expected "
                "multipart/form-data or application/octet-stream"
            )
    except AenvError as exc:
        return _rendered(exc)
    except ClientDisconnect:
        return error_response(400, "client disconnected during the upload")
    return JSONResponse(upload.written)


def _metadata(request: Request) -> dict[str, str]:
    """``X-Metadata-<key>`` headers as ``{lowercased key: value}``; each upload replaces all."""
    metadata: dict[str, str] = {}
    for name, value in request.headers.items():
        if not name.startswith(_METADATA_HEADER):
            continue
        key = name[len(_METADATA_HEADER):]
        if not _TOKEN.fullmatch(key):
            raise InvalidArgument(f"invalid metadata key {key!r}")
        if not _PRINTABLE.fullmatch(value):
            raise InvalidArgument(f"invalid metadata value for key {key!r}")
        metadata[key] = value
    return metadata


async def _decoded_body(request: Request) -> AsyncIterator[bytes]:
    """The request body, gunzipped when ``Content-Encoding: gzip`` (several members allowed)."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        async for chunk in request.stream():
            if chunk:
                yield chunk
        return
    if encoding not in ("gzip", "x-gzip"):
        raise InvalidArgument(f"unsupported Content-Encoding: {encoding}, supported: [gzip]")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        async for chunk in request.stream():
            pending = chunk
            while pending:
                # Bounded output per step, so a small bomb cannot balloon in memory.
                out = inflater.decompress(pending, CHUNK)
                pending = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:
                    pending = inflater.unused_data + pending
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                if out:
                    yield out
        if not inflater.eof:
            raise InvalidArgument("gzip body is truncated")
    except zlib.error as exc:
        raise InvalidArgument(f"invalid gzip body: {exc}") from exc


class _Sink:
    """One destination file being written, buffered into ``CHUNK``-sized thread-side writes."""

    def __init__(self, path: str, fd: int, user: User) -> None:
        self.path, self.fd, self.user = path, fd, user
        self.buffer = bytearray()

    async def write(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= CHUNK:
            await self.flush()

    async def flush(self) -> None:
        if self.buffer:
            data, self.buffer = self.buffer, bytearray()
            await asyncio.to_thread(_write_all, self.fd, self.path, data)

    async def finish(self, metadata: dict[str, str]) -> None:
        await self.flush()
        # As the user: setting xattrs is a permission check of its own.
        await as_user(self.user, write_metadata, self.fd, metadata, self.path)
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, path: str, data: bytearray) -> None:
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError as exc:
        raise os_failure(exc, f"writing '{path}'") from exc


class _Upload:
    """The files of one POST, written in order; :attr:`written` is the response body."""

    def __init__(
        self, state: EnvdState, user: User, metadata: dict[str, str],
        watchers: WatcherRegistry, query_path: str | None,
    ) -> None:
        self.state, self.user, self.metadata = state, user, metadata
        self.watchers, self.query_path = watchers, query_path
        self.written: list[dict[str, Any]] = []
        self._sink: _Sink | None = None

    async def raw(self, body: AsyncIterator[bytes]) -> None:
        if not self.query_path:
            raise InvalidArgument("path query parameter is required for raw body upload")
        sink = await self._open(self.query_path)
        try:
            async for chunk in body:
                await sink.write(chunk)
            await self._finish(sink)
        finally:
            sink.close()

    async def multipart(self, body: AsyncIterator[bytes], boundary: bytes) -> None:
        events: list[tuple[str, bytes]] = []

        def data(kind: str) -> Callable[[bytes, int, int], None]:
            return lambda buf, start, end: events.append((kind, buf[start:end]))

        def mark(kind: str) -> Callable[[], None]:
            return lambda: events.append((kind, b""))

        callbacks: Any = {
            "on_part_begin": mark("begin"), "on_header_field": data("field"),
            "on_header_value": data("value"), "on_header_end": mark("header_end"),
            "on_headers_finished": mark("headers_done"), "on_part_data": data("data"),
            "on_part_end": mark("end"), "on_end": mark("done"),
        }
        try:
            parser = MultipartParser(boundary, callbacks)
        except (FormParserError, ValueError) as exc:
            raise InvalidArgument(f"invalid multipart boundary: {exc}") from exc
        part = _PartHeaders()
        done = False
        try:
            async for chunk in body:
                try:
                    parser.write(chunk)
                except FormParserError as exc:
                    raise InvalidArgument(f"malformed multipart body: {exc}") from exc
                for kind, value in events:
                    done = await self._on_part_event(part, kind, value) or done
                events.clear()
            if not done:
                raise InvalidArgument("multipart body ended before its closing boundary")
        finally:
            if self._sink is not None:
                self._sink.close()

    async def _on_part_event(self, part: _PartHeaders, kind: str, value: bytes) -> bool:
        if kind == "data":
            if self._sink is not None:
                await self._sink.write(value)
        elif kind == "begin":
            part.reset()
        elif kind == "field":
            part.field += value
        elif kind == "value":
            part.value += value
        elif kind == "header_end":
            part.commit()
        elif kind == "headers_done":
            self._sink = await self._open_part(part)
        elif kind == "end" and self._sink is not None:
            sink, self._sink = self._sink, None
            await self._finish(sink)
        return kind == "done"

    async def _open_part(self, part: _PartHeaders) -> _Sink | None:
        _, params = parse_options_header(part.headers.get(b"content-disposition", b""))
        if params.get(b"name") != b"file":
            return None  # envd ignores other form fields
        if self.query_path:
            target = self.query_path
        else:
            filename = params.get(b"filename")
            if filename is None:
                raise InvalidArgument("filename not found in Content-Disposition header")
            target = filename.decode("utf-8", "surrogateescape")
        return await self._open(target)

    async def _open(self, target: str) -> _Sink:
        path = resolve_path(target, self.user, self.state.default_workdir)
        if any(entry["path"] == wire_str(path) for entry in self.written):
            raise InvalidArgument(
                f"you cannot upload multiple files to the same path '{path}' in one upload "
                "request, only the first specified file was uploaded"
            )
        user = self.user
        # As the user: what they may not create or open is refused (403), through symlinks
        # and ``..`` alike, and what they create is theirs.
        created = await as_user(user, ensure_dirs, posixpath.dirname(path), user.uid, user.gid)
        if created:
            # Recursive watchers must watch the new directories before the file appears.
            self.watchers.pump_all()
        fd = await as_user(user, create_or_truncate, path, user.uid, user.gid)
        return _Sink(path, fd, user)

    async def _finish(self, sink: _Sink) -> None:
        await sink.finish(self.metadata)
        entry: dict[str, Any] = {
            "path": wire_str(sink.path), "name": wire_str(posixpath.basename(sink.path)),
            "type": "file",
        }
        if self.metadata:
            entry["metadata"] = {key.lower(): value for key, value in self.metadata.items()}
        self.written.append(entry)


class _PartHeaders:
    """Headers of the multipart part being parsed, as python-multipart reports them in pieces."""

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.field = b""
        self.value = b""

    def reset(self) -> None:
        self.headers.clear()
        self.field = self.value = b""

    def commit(self) -> None:
        self.headers[self.field.strip().lower()] = self.value.strip()
        self.field = self.value = b""
