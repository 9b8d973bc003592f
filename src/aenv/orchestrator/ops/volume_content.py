"""The volume content API's operations (E2B's ``openapi-volumecontent``): list, stat, read,
write, mkdir, change metadata, remove — on a volume checked out on this node for the length
of each request (``orchestrator/volumes.py``), confined to it as if chrooted
(``storage/volume_files.py``).

Reads are allowed at any time; writes are refused (``Conflict``, 409) while a sandbox has the
volume mounted read-write. A write past the volume's size is ``NotEnoughSpace`` (507), and
the partial file is removed. A read streams in 1 MiB pieces and keeps the volume checked out
until the last one is sent (or the client goes away).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator

from aenv.orchestrator.context import Node
from aenv.storage import volume_files
from aenv.storage.volume_files import EntryStat

#: Reads go out in pieces of this size (E2B's server streams 1 MiB chunks).
READ_PIECE = 1 << 20


async def stat(node: Node, volume_id: str, path: str) -> EntryStat:
    async with node.volumes.content(volume_id, write=False) as root:
        return await asyncio.to_thread(volume_files.stat, root, path)


async def list_dir(node: Node, volume_id: str, path: str, depth: int | None
                   ) -> list[EntryStat]:
    async with node.volumes.content(volume_id, write=False) as root:
        return await asyncio.to_thread(volume_files.list_dir, root, path, depth)


async def make_dir(node: Node, volume_id: str, path: str, *, uid: int | None, gid: int | None,
                   mode: int | None, force: bool) -> EntryStat:
    async with node.volumes.content(volume_id, write=True) as root:
        return await asyncio.to_thread(
            lambda: volume_files.make_dir(root, path, force=force, **_owner(uid, gid, mode,
                                                                            0o777)))


async def update(node: Node, volume_id: str, path: str, *, uid: int | None, gid: int | None,
                 mode: int | None) -> EntryStat:
    async with node.volumes.content(volume_id, write=True) as root:
        return await asyncio.to_thread(
            lambda: volume_files.update_metadata(root, path, uid=uid, gid=gid, mode=mode))


async def remove(node: Node, volume_id: str, path: str) -> None:
    async with node.volumes.content(volume_id, write=True) as root:
        await asyncio.to_thread(volume_files.remove, root, path)


async def read(node: Node, volume_id: str, path: str) -> tuple[int, AsyncIterator[bytes]]:
    """The file's size and its bytes; errors (missing, a directory) come before the first
    byte, so they are answered with their status. The volume is held only while the file is
    opened: the open file keeps an idle release from unmounting it (busy: retried later)."""
    async with node.volumes.content(volume_id, write=False) as root:
        fd, size = await asyncio.to_thread(volume_files.open_read, root, path)
    opened = _OpenFile(fd)

    async def pieces() -> AsyncIterator[bytes]:
        try:
            while piece := await asyncio.to_thread(opened.next_piece):
                yield piece
        finally:
            opened.close()

    stream = pieces()
    # A response that never starts its body (the client left first) still closes the file.
    weakref.finalize(stream, opened.close)
    return size, stream


class _OpenFile:
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()

    def next_piece(self) -> bytes:
        with self._lock:
            return b"" if self._fd is None else os.read(self._fd, READ_PIECE)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


async def write(node: Node, volume_id: str, path: str, body: AsyncIterator[bytes], *,
                uid: int | None, gid: int | None, mode: int | None, force: bool
                ) -> EntryStat:
    async with node.volumes.content(volume_id, write=True) as root:
        fd = await asyncio.to_thread(
            lambda: volume_files.open_write(root, path, force=force,
                                            **_owner(uid, gid, mode, 0o666)))
        pieces = aiter(body)
        while True:
            try:
                piece = await anext(pieces, None)
            except BaseException:
                # The client went away mid-body: no half file is left.
                await asyncio.shield(asyncio.to_thread(volume_files.abort_write, root, fd, path))
                raise
            if piece is None:
                break
            if piece:
                # On failure (a full volume) it has removed the file and closed ``fd``.
                await asyncio.to_thread(volume_files.write_all, root, fd, path, piece)
        return await asyncio.to_thread(volume_files.finish_write, root, fd, path)


def _owner(uid: int | None, gid: int | None, mode: int | None, default_mode: int
           ) -> dict[str, int]:
    return {"uid": volume_files.DEFAULT_ID if uid is None else uid,
            "gid": volume_files.DEFAULT_ID if gid is None else gid,
            "mode": default_mode if mode is None else mode}
