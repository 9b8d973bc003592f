"""Content-addressed blobs: in the repository by digest, and the node's local cache of them.

Owns ``<home>/cache/blobs/`` and nothing else::

    <home>/cache/blobs/sha256/<hex>       one blob, named by the sha256 of its bytes, read-only
    <home>/cache/blobs/.partial/<random>  a fetch or adoption in progress (swept at start)

In the repository a blob is the object ``blobs/sha256/<hex>``. A blob is written once and never
changed, so whoever has the digest has the bytes: a put of a blob that exists is skipped, and a
fetched blob is hashed on the way and kept only if it matches (a corrupt or truncated download
is an error, never a cached file). Several snapshots share a blob (the base layer, the envd
bundle); the garbage collector (``storage/gc.py``) removes those no manifest names.

The cache is bounded (``repository_cache_bytes``): :meth:`BlobCache.trim` drops the least
recently used blobs nothing has pinned and none placed in the last ``KEEP_NEW_S`` (a commit
puts blobs the node made before it — a disk's chunks, a memory image — from here: one dropped
in between failed the snapshot); a dropped blob is fetched again when needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aenv.core import telemetry
from aenv.core.errors import DataLoss, InvalidArgument, NotFound
from aenv.storage.files import fsync_dirs, listdir, rmtree
from aenv.storage.objects import ObjectStore

log = logging.getLogger("aenv.storage.blobs")

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_READ_BYTES = 1 << 20
BLOB_PREFIX = "blobs/sha256/"
#: A blob placed in the cache this recently is never trimmed: longer than a commit takes.
KEEP_NEW_S = 600.0


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidArgument(f"invalid blob digest {digest!r} (want sha256:<64 hex digits>)")
    return digest


def blob_key(digest: str) -> str:
    """The repository key of a blob."""
    return BLOB_PREFIX + check_digest(digest).removeprefix("sha256:")


def digest_of_key(key: str) -> str | None:
    """The digest a repository key names, or ``None`` if it is not a blob key."""
    if not key.startswith(BLOB_PREFIX):
        return None
    digest = "sha256:" + key.removeprefix(BLOB_PREFIX)
    return digest if _DIGEST.fullmatch(digest) else None


def hash_file(path: Path) -> tuple[str, int]:
    """``(digest, size)`` of a file (blocking)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_READ_BYTES):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


@dataclass(frozen=True)
class BlobRef:
    digest: str
    size: int


class BlobSource(Protocol):
    """Somewhere a blob may be had before the repository (another node of a cluster)."""

    async def open(self, digest: str) -> AsyncIterator[bytes] | None:
        """The blob's bytes, or None if no one here has it. The stream may fail midway."""


class BlobCache:
    """The node's local copies of repository blobs."""

    def __init__(self, root: Path, budget_bytes: int = 0) -> None:
        #: ``<home>/cache/blobs``.
        self.root = Path(root)
        self._dir = self.root / "sha256"
        self._partial = self.root / ".partial"
        #: 0: unbounded.
        self.budget_bytes = budget_bytes
        self._fetching: dict[str, asyncio.Future[Path]] = {}
        self._pins: dict[str, int] = {}
        #: Tried before a remote repository (``peer_fetch``); None: the repository only.
        self.peers: BlobSource | None = None

    def start(self) -> list[str]:
        """Create the directories and remove what crashed fetches left; returns the removed."""
        self._dir.mkdir(parents=True, exist_ok=True)
        self._partial.mkdir(parents=True, exist_ok=True)
        removed = []
        for name in listdir(self._partial):
            rmtree(self._partial / name)
            removed.append(str(self._partial / name))
        return removed

    def path(self, digest: str) -> Path:
        return self._dir / check_digest(digest).removeprefix("sha256:")

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def usage(self) -> int:
        return sum(size for _, size, _ in self._entries())

    # -- filling ------------------------------------------------------------------------------

    async def adopt(self, path: Path) -> tuple[BlobRef, Path]:
        """Take a local file the node made (a memory image file, an exported layer) as a blob.

        On success: the file is hashed and hard-linked into the cache (copied if on another
        filesystem); the cached file is returned. The source is unchanged (do not modify it
        afterwards: it shares the inode).
        """
        digest, size = await asyncio.to_thread(hash_file, path)
        final = self.path(digest)
        if not final.exists():
            await asyncio.to_thread(self.place, path, final)
        return BlobRef(digest, size), final

    def place(self, source: Path, final: Path) -> None:
        """Put the finished file ``source`` into the cache as ``final`` (fsynced, linked or
        copied, read-only); ``source`` stays (blocking)."""
        self._partial.mkdir(parents=True, exist_ok=True)
        temporary = self._partial / secrets.token_hex(8)
        # Durable before it is named by digest: a memory image fresh from a checkpoint may
        # still be in the page cache, and a committed snapshot must survive a power cut.
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(source, temporary)
        except OSError:
            _copy_file(source, temporary)
        temporary.chmod(0o400)
        temporary.rename(final)

    async def fetch(self, store: ObjectStore, ref: BlobRef) -> Path:
        """The cached file of blob ``ref``, downloaded from ``store`` first if missing.

        Concurrent fetches of one digest share one download.
        On failure: :class:`DataLoss` if the bytes do not match the digest or size (nothing is
        kept); :class:`NotFound` / :class:`Unavailable` from the store.
        """
        final = self.path(ref.digest)
        if final.is_file():
            self._touch(final)
            telemetry.BLOB_READS.labels(source="cache").inc()
            telemetry.BLOB_BYTES.labels(source="cache").inc(ref.size)
            return final
        running = self._fetching.get(ref.digest)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        self._fetching[ref.digest] = future
        try:
            path = await self._download(store, ref, final)
            future.set_result(path)
            return path
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a fetch nobody else awaited must not warn
            raise
        finally:
            del self._fetching[ref.digest]

    async def _download(self, store: ObjectStore, ref: BlobRef, final: Path) -> Path:
        self._partial.mkdir(parents=True, exist_ok=True)
        temporary = self._partial / secrets.token_hex(8)
        try:
            local = store.local_path(blob_key(ref.digest))
            from_peer = None
            if local is not None:
                # A posix repository on this machine: link (or copy) the file, hash it here.
                got, size = await asyncio.to_thread(_take_local, local, temporary)
            elif self.peers is not None and (from_peer := await _from_peer(
                    self.peers, ref, temporary)) is not None:
                got, size = from_peer
            else:
                got, size = await _stream_to(store, ref, temporary)
            if got != ref.digest or size != ref.size:
                raise DataLoss(
                    f"blob {ref.digest} from {store.describe()} is corrupt: got {size} bytes "
                    f"hashing to {got}, want {ref.size} bytes"
                )
            temporary.chmod(0o400)
            temporary.rename(final)
            fsync_dirs(final.parent)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        log.info("fetched blob %s (%d bytes) from %s", ref.digest, ref.size,
                 "a peer" if from_peer else store.describe())
        source = "peer" if from_peer else "repository"
        telemetry.BLOB_READS.labels(source=source).inc()
        telemetry.BLOB_BYTES.labels(source=source).inc(ref.size)
        return final

    # -- bounding -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def pinned(self, digests: Iterable[str]) -> Iterator[None]:
        """Keep these blobs from :meth:`trim` while the block runs (a restore reading them)."""
        held = list(digests)
        for digest in held:
            self._pins[digest] = self._pins.get(digest, 0) + 1
        try:
            yield
        finally:
            for digest in held:
                self._pins[digest] -= 1
                if not self._pins[digest]:
                    del self._pins[digest]

    def trim(self, keep: Iterable[str] = ()) -> list[str]:
        """Drop least recently used blobs until the cache fits its budget; returns the digests.

        Never drops a pinned blob, one in ``keep``, or one placed (or used: a use touches it)
        in the last ``KEEP_NEW_S``.
        """
        if not self.budget_bytes:
            return []
        entries = sorted(self._entries(), key=lambda entry: entry[2])
        usage = sum(size for _, size, _ in entries)
        protected = set(keep) | set(self._pins)
        placed_before = time.time() - KEEP_NEW_S
        dropped = []
        for digest, size, _ in entries:
            if usage <= self.budget_bytes:
                break
            if digest in protected or self._placed_at(digest) > placed_before:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.path(digest).unlink()
            usage -= size
            dropped.append(digest)
        if dropped:
            log.info("cache over budget: dropped %d blobs", len(dropped))
        return dropped

    def _entries(self) -> list[tuple[str, int, float]]:
        found = []
        for name in listdir(self._dir):
            try:
                st = os.stat(self._dir / name)
            except FileNotFoundError:
                continue
            found.append(("sha256:" + name, st.st_size, st.st_atime))
        return found

    def _placed_at(self, digest: str) -> float:
        # A blob is named by a rename (and linked, chmodded) when placed: its ctime says when.
        try:
            return os.stat(self.path(digest)).st_ctime
        except FileNotFoundError:
            return 0.0

    def _touch(self, path: Path) -> None:
        # relatime may not update atime on reads; the cache's recency is set by hand.
        now = time.time()
        with contextlib.suppress(OSError):
            os.utime(path, (now, os.stat(path).st_mtime))


async def _stream_to(store: ObjectStore, ref: BlobRef, temporary: Path) -> tuple[str, int]:
    return await _write_hashed(store.stream(blob_key(ref.digest)), temporary)


async def _write_hashed(chunks: AsyncIterator[bytes], temporary: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(temporary, "wb") as out:
        async for chunk in chunks:
            h.update(chunk)
            size += len(chunk)
            await asyncio.to_thread(out.write, chunk)
        await asyncio.to_thread(os.fsync, out.fileno())
    return "sha256:" + h.hexdigest(), size


async def _from_peer(peers: BlobSource, ref: BlobRef, temporary: Path) -> tuple[str, int] | None:
    """The blob from a peer into ``temporary`` if one has it whole and right, else None."""
    try:
        chunks = await peers.open(ref.digest)
        if chunks is None:
            return None
        got, size = await _write_hashed(chunks, temporary)
    except Exception as exc:  # a peer is an optimization: any failure means the repository
        log.info("blob %s from a peer failed (%s); from the repository", ref.digest, exc)
        return None
    if (got, size) != (ref.digest, ref.size):
        log.warning("blob %s from a peer was corrupt (%d bytes hashing to %s); from the "
                    "repository", ref.digest, size, got)
        return None
    return got, size


def _take_local(source: Path, temporary: Path) -> tuple[str, int]:
    """Hard-link (else copy) a posix repository's blob file and hash it (blocking)."""
    try:
        os.link(source, temporary)
    except FileNotFoundError as exc:
        raise NotFound(f"blob {source.name} is not in the repository") from exc
    except OSError:
        _copy_file(source, temporary)
    return hash_file(temporary)


def _copy_file(source: Path, destination: Path) -> None:
    with open(source, "rb") as src, open(destination, "wb") as dst:
        while chunk := src.read(_READ_BYTES):
            dst.write(chunk)
        os.fsync(dst.fileno())
