"""``Volumes``: E2B's persistent volumes: ``/volumes`` with the API key, ``/volumecontent/{id}/…``
with a volume's token, both on the client's API URL (wire contract: docs/volumes-protocol.md).

``client.volumes`` borrows an open :class:`~aenv.client.AsyncClient`'s connections, retries
and error conversion (``rest.py``): a missing volume or path is :class:`NotFound`, a volume in
use :class:`Conflict`, a full one (507) :class:`Unavailable`, as for sandbox calls.

Tokens: ``create`` and ``get`` answer with a fresh one; a content call given a bare id, or a
:class:`VolumeInfo` from ``list`` (no token), gets one first.

File bodies (reads and writes) are streamed in one attempt, never retried: a stream cannot be
replayed, and a write without ``force`` that did land would come back as "already exists". The
rest goes through ``NodeApi.request`` and its retry rules.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from aenv.client.errors import InvalidRequest, NotFound, Unavailable
from aenv.client.rest import NodeApi, http_error, json_of, transport_reason

#: Pieces of a streamed file, both ways (the node reads and sends 1 MiB at a time).
CHUNK = 1 << 20


@dataclass(frozen=True)
class VolumeInfo:
    volume_id: str
    name: str
    #: The volume's size, its quota (aenv's own; None when the server is not aenv).
    size_mb: int | None = None
    #: What the content API takes; only ``create`` and ``get`` hand one out.
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_wire(cls, raw: Any) -> VolumeInfo:
        if not isinstance(raw, dict) or not isinstance(raw.get("volumeID"), str):
            raise InvalidRequest(f"unexpected volume in the node's answer: {raw!r}"[:300])
        size = raw.get("sizeMB")
        return cls(raw["volumeID"], str(raw.get("name", "")),
                   size if isinstance(size, int) else None, raw.get("token") or None)

    def wire(self) -> dict[str, Any]:
        """E2B's ``Volume`` (and aenv's ``sizeMB``); never the token."""
        return {"volumeID": self.volume_id, "name": self.name, **_given(sizeMB=self.size_mb)}


@dataclass(frozen=True)
class VolumeEntry:
    """One file, directory or link (E2B's ``VolumeEntryStat``); for a link ``type`` and
    ``mode`` are its target's and ``target`` its text."""

    name: str
    type: str
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    target: str | None = None

    @classmethod
    def from_wire(cls, raw: Any) -> VolumeEntry:
        try:
            return cls(name=str(raw["name"]), type=str(raw["type"]), path=str(raw["path"]),
                       size=int(raw["size"]), mode=int(raw["mode"]), uid=int(raw["uid"]),
                       gid=int(raw["gid"]), atime=datetime.fromisoformat(raw["atime"]),
                       mtime=datetime.fromisoformat(raw["mtime"]),
                       ctime=datetime.fromisoformat(raw["ctime"]), target=raw.get("target"))
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest(f"unexpected entry in the node's answer: {raw!r}"[:300]) from None

    def wire(self) -> dict[str, Any]:
        """As the node sent it (the field names are E2B's)."""
        return {k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in asdict(self).items() if v is not None}


#: A volume as content calls take it: its id, or what ``create``/``get``/``find`` returned.
VolumeRef = VolumeInfo | str


def _quoted(value: str) -> str:
    return quote(value, safe="")


def _given(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class Volumes:
    """The volumes of the client's node, and their files (no sandbox needed)."""

    def __init__(self, api: NodeApi) -> None:
        # The client's own plumbing, so retries and errors are the client's.
        self._api = api

    # -- the control plane (the API key) --

    async def create(self, name: str, *, size_mb: int | None = None) -> VolumeInfo:
        """A new, empty volume named ``name`` (letters, digits, ``-``, ``_``), with a token.
        A name already taken is refused with the node's message."""
        what = f"create volume {name!r}"
        response = await self._api.request("POST", "volumes", what=what, idempotent=False,
                                           json={"name": name, **_given(sizeMB=size_mb)})
        return VolumeInfo.from_wire(json_of(response, what))

    async def list(self) -> builtins.list[VolumeInfo]:
        """Every volume (without tokens)."""
        response = await self._api.request("GET", "volumes", what="list volumes",
                                           idempotent=True)
        return [VolumeInfo.from_wire(v) for v in json_of(response, "list volumes")]

    async def get(self, volume_id: str) -> VolumeInfo:
        """The volume with a fresh token; :class:`NotFound` if there is none of that id."""
        what = f"get volume {volume_id}"
        response = await self._api.request("GET", f"volumes/{_quoted(volume_id)}", what=what,
                                           idempotent=True)
        return VolumeInfo.from_wire(json_of(response, what))

    async def find(self, id_or_name: str) -> VolumeInfo:
        """The volume of that id, else of that name (without a token): what a person types."""
        found = await self.list()
        hit = (next((v for v in found if v.volume_id == id_or_name), None)
               or next((v for v in found if v.name == id_or_name), None))
        if hit is None:
            raise NotFound(f"no volume with the id or name {id_or_name!r}")
        return hit

    async def delete(self, volume_id: str) -> bool:
        """Delete the volume and its files; False if there was none of that id.
        :class:`Conflict` while a sandbox mounts it."""
        try:
            await self._api.request("DELETE", f"volumes/{_quoted(volume_id)}",
                                    what=f"delete volume {volume_id}", idempotent=True)
        except NotFound:
            return False
        return True

    # -- the content plane (the volume's token); paths are volume-absolute --

    async def list_dir(self, volume: VolumeRef, path: str = "/", *,
                       depth: int | None = None) -> builtins.list[VolumeEntry]:
        """The entries under ``path``, each followed by its own down to ``depth`` levels
        (default 1); ``path`` itself is not listed."""
        found = await self._call(volume, "GET", "dir", path, f"list {path}", idempotent=True,
                                 params=_given(depth=depth))
        return [VolumeEntry.from_wire(e) for e in found]

    async def stat(self, volume: VolumeRef, path: str) -> VolumeEntry:
        return VolumeEntry.from_wire(
            await self._call(volume, "GET", "path", path, f"stat {path}", idempotent=True))

    async def make_dir(self, volume: VolumeRef, path: str, *, force: bool = False,
                       uid: int | None = None, gid: int | None = None,
                       mode: int | None = None) -> VolumeEntry:
        """A directory; ``force``: with its parents, and an existing directory is success."""
        params = _given(uid=uid, gid=gid, mode=mode, force=force)
        return VolumeEntry.from_wire(await self._call(
            volume, "POST", "dir", path, f"make directory {path}", idempotent=force,
            params=params))

    async def remove(self, volume: VolumeRef, path: str) -> None:
        """Remove a file, or a directory with everything in it."""
        await self._call(volume, "DELETE", "path", path, f"remove {path}", idempotent=True,
                         parse=False)

    async def read_file(self, volume: VolumeRef, path: str) -> bytes:
        """The whole file, in memory: use :meth:`iter_file` or :meth:`download` for big ones."""
        async with self._reading(volume, path) as pieces:
            return b"".join([piece async for piece in pieces])

    async def iter_file(self, volume: VolumeRef, path: str) -> AsyncIterator[bytes]:
        """The file in pieces as they arrive; a missing path fails before the first one."""
        async with self._reading(volume, path) as pieces:
            async for piece in pieces:
                yield piece

    async def download(self, volume: VolumeRef, path: str, local: str | os.PathLike[str]
                       ) -> int:
        """Stream the file to ``local``; the number of bytes. ``local`` is replaced only once
        the whole file arrived, and is left alone when the remote path does not exist."""
        target = Path(local)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
        written = 0
        async with self._reading(volume, path) as pieces:
            try:
                with open(partial, "xb") as out:
                    async for piece in pieces:
                        await asyncio.to_thread(out.write, piece)
                        written += len(piece)
                partial.replace(target)
            finally:
                partial.unlink(missing_ok=True)
        return written

    async def write_file(self, volume: VolumeRef, path: str,
                         data: bytes | AsyncIterable[bytes], *, force: bool = False,
                         uid: int | None = None, gid: int | None = None,
                         mode: int | None = None) -> VolumeEntry:
        """Write ``data`` (bytes, or pieces streamed as they come) to a new file. Without
        ``force`` an existing file is :class:`Conflict` and a missing parent
        :class:`NotFound`; with it the file is replaced and parents are made."""
        info, headers = await self._authorized(volume)
        what = f"write {path} to volume {info.name or info.volume_id}"
        request = self._api.http.build_request(
            "PUT", _content_path(info, "file"), content=data,
            params={"path": path, **_given(uid=uid, gid=gid, mode=mode, force=force)},
            headers={**headers, "Content-Type": "application/octet-stream"})
        response = await self._send(request, what)
        return VolumeEntry.from_wire(json_of(response, what))

    async def upload(self, volume: VolumeRef, path: str, local: str | os.PathLike[str], *,
                     force: bool = False, uid: int | None = None, gid: int | None = None,
                     mode: int | None = None) -> VolumeEntry:
        """:meth:`write_file` of a local file, streamed (never whole in memory)."""
        with open(local, "rb") as source:
            return await self.write_file(volume, path, _pieces(source), force=force, uid=uid,
                                         gid=gid, mode=mode)

    # -- plumbing --

    async def _authorized(self, volume: VolumeRef) -> tuple[VolumeInfo, dict[str, str]]:
        info = volume if isinstance(volume, VolumeInfo) else await self.get(volume)
        if info.token is None:
            info = await self.get(info.volume_id)
        return info, {"Authorization": f"Bearer {info.token}"}

    async def _call(self, volume: VolumeRef, method: str, kind: str, path: str, doing: str, *,
                    idempotent: bool, params: Mapping[str, Any] | None = None,
                    parse: bool = True) -> Any:
        info, headers = await self._authorized(volume)
        what = f"{doing} in volume {info.name or info.volume_id}"
        response = await self._api.request(
            method, _content_path(info, kind), what=what, idempotent=idempotent,
            params={"path": path, **(params or {})}, headers=headers)
        return json_of(response, what) if parse else None

    @contextlib.asynccontextmanager
    async def _reading(self, volume: VolumeRef, path: str
                       ) -> AsyncIterator[AsyncIterator[bytes]]:
        info, headers = await self._authorized(volume)
        what = f"read {path} from volume {info.name or info.volume_id}"
        request = self._api.http.build_request("GET", _content_path(info, "file"),
                                               params={"path": path}, headers=headers)
        response = await self._send(request, what, stream=True)
        try:
            yield self._body(response, what)
        finally:
            await response.aclose()

    async def _body(self, response: httpx.Response, what: str) -> AsyncIterator[bytes]:
        try:
            async for piece in response.aiter_bytes(CHUNK):
                yield piece
        except httpx.TransportError as exc:  # the node went away mid-file: no whole file
            raise Unavailable(f"{what}: {transport_reason(exc, self._api.http.base_url)}") from exc

    async def _send(self, request: httpx.Request, what: str, *, stream: bool = False
                    ) -> httpx.Response:
        """One attempt (see the module doc), its failure converted as ``NodeApi`` does."""
        try:
            response = await self._api.http.send(request, stream=stream)
            if response.status_code >= 400:
                await response.aread()
                await response.aclose()
                raise http_error(response, what, None, None)
        except httpx.TransportError as exc:
            raise Unavailable(f"{what}: {transport_reason(exc, self._api.http.base_url)}") from exc
        return response


def _content_path(info: VolumeInfo, kind: str) -> str:
    return f"volumecontent/{_quoted(info.volume_id)}/{kind}"


async def _pieces(source: IO[bytes]) -> AsyncIterator[bytes]:
    while piece := await asyncio.to_thread(source.read, CHUNK):
        yield piece
