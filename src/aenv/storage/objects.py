"""The repository's object store: one interface over a posix directory or an S3 bucket.

Both backends are ``obstore`` stores (``LocalStore``, ``S3Store``); this module chooses one from
the ``repository`` setting, bounds its retries and timeouts, and turns its exceptions into
aenv's errors at one boundary (:func:`_mapped`). Keys are ``/``-separated relative paths; what
they mean is the caller's business (``storage/blobs.py``, ``storage/repository.py``).

Guarantees both backends give, and the repository relies on:
- a put is atomic: readers see the whole object or nothing (LocalStore writes a temporary file
  and renames it; S3 publishes an object, multipart included, only when complete);
- ``put(..., create=True)`` fails with :class:`AlreadyExists` if the key exists (LocalStore:
  ``link(2)``; S3: ``If-None-Match: *``), so two writers cannot both commit one manifest;
- a delete of a missing key succeeds (what is already gone counts as removed).

A posix repository on the node's own filesystem takes a shortcut for files: :meth:`put_file`
hard-links instead of copying (a memory image is hundreds of MB; a link costs nothing and the
file is immutable from then on). obstore has no such call; it is the one hand-written path.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import logging
import os
import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import obstore
from obstore import exceptions as obx
from obstore.store import LocalStore, S3Store

from aenv.core.errors import AenvError, AlreadyExists, InvalidArgument, NotFound, Unavailable

log = logging.getLogger("aenv.storage.objects")

#: How long one request may take before it counts as failed (a slow endpoint must become a
#: clear error, not a hung commit); large objects are multipart, so this bounds one part.
REQUEST_TIMEOUT_S = 60.0
#: Retries of a failed request (5xx, connection errors), with exponential backoff from
#: :data:`BACKOFF_S`; after them the caller gets :class:`Unavailable`.
MAX_RETRIES = 4
BACKOFF_S = 0.1
#: Part size of multipart uploads (S3's minimum is 5 MiB).
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class PosixLocation:
    kind: Literal["posix_fs"]
    root: Path

    def describe(self) -> str:
        return str(self.root)


@dataclass(frozen=True)
class S3Location:
    kind: Literal["s3"]
    bucket: str
    prefix: str
    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    #: Kept out of ``repr`` (a location shows up in logs and tracebacks).
    secret_access_key: str | None = field(default=None, repr=False)
    allow_http: bool = False
    virtual_hosted: bool = False

    def describe(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


Location = PosixLocation | S3Location


def parse_location(value: str, *, s3: dict[str, Any] | None = None) -> Location:
    """The repository named by ``value``: a directory path, or ``s3://BUCKET[/PREFIX]``.

    ``s3`` holds the endpoint, region, credentials and addressing options (from the settings,
    which read the standard ``AWS_*`` variables). Raises :class:`InvalidArgument` for anything
    else (another scheme, a relative path, an s3 URL without a bucket).
    """
    if "://" in value:
        url = urlparse(value)
        if url.scheme != "s3":
            raise InvalidArgument(f"repository {value!r}: only s3:// URLs or a directory path")
        if not url.netloc:
            raise InvalidArgument(f"repository {value!r}: no bucket")
        options = {k: v for k, v in (s3 or {}).items() if v is not None}
        return S3Location(kind="s3", bucket=url.netloc, prefix=url.path.strip("/"), **options)
    path = Path(value)
    if not path.is_absolute():
        raise InvalidArgument(f"repository {value!r}: a directory must be an absolute path")
    return PosixLocation(kind="posix_fs", root=path)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    #: Wall-clock time of the last write (the store's clock).
    modified: datetime.datetime


class ObjectStore:
    """Async object operations on one repository location."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._store = _build(location)

    def describe(self) -> str:
        return self.location.describe()

    # -- reads --------------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        """The object's size and time, or ``None`` if there is none."""
        with _mapped(self, key):
            try:
                meta = await obstore.head_async(self._store, key)
            except FileNotFoundError:
                return None
        return ObjectInfo(key, int(meta["size"]), meta["last_modified"])

    async def get_bytes(self, key: str) -> bytes:
        """A small object whole (manifests). :class:`NotFound` if missing."""
        with _mapped(self, key):
            result = await obstore.get_async(self._store, key)
            return bytes(await result.bytes_async())

    async def stream(self, key: str) -> AsyncIterator[bytes]:
        """A large object in chunks. :class:`NotFound` if missing; errors mid-stream map too."""
        with _mapped(self, key):
            result = await obstore.get_async(self._store, key)
            async for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                yield bytes(chunk)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (a ``/``-terminated key prefix), in no set order."""
        found: list[ObjectInfo] = []
        with _mapped(self, prefix):
            async for batch in obstore.list(self._store, prefix.rstrip("/") or None):
                found.extend(
                    ObjectInfo(m["path"], int(m["size"]), m["last_modified"]) for m in batch
                )
        return found

    async def missing(self, keys: Sequence[str], *, concurrency: int = 16) -> set[str]:
        """The ``keys`` the store does not hold now. Posix: one thread stats them all (a
        HEAD each through obstore costs ~80 us of thread hand-off); S3: HEADs,
        ``concurrency`` at a time."""
        if isinstance(self.location, PosixLocation):
            root = self.location.root
            return await asyncio.to_thread(
                lambda: {k for k in keys if not os.path.isfile(root / k)})
        limit = asyncio.Semaphore(concurrency)

        async def gone(key: str) -> bool:
            async with limit:
                return await self.head(key) is None

        found = await asyncio.gather(*(gone(k) for k in keys))
        return {k for k, absent in zip(keys, found, strict=True) if absent}

    def local_path(self, key: str) -> Path | None:
        """Where a posix repository keeps ``key`` (readers on this machine may link or copy
        it directly); ``None`` for S3."""
        if isinstance(self.location, PosixLocation):
            return self.location.root / key
        return None

    # -- writes -------------------------------------------------------------------------------

    async def put_bytes(self, key: str, data: bytes, *, create: bool = False) -> None:
        """Write a small object atomically; ``create``: :class:`AlreadyExists` if it exists."""
        with _mapped(self, key):
            await obstore.put_async(self._store, key, data, mode="create" if create else None)

    async def put_file(self, key: str, path: Path) -> None:
        """Write the file at ``path`` (immutable from now on) as ``key``, atomically.

        A posix repository on the file's own filesystem gets a hard link; otherwise the bytes
        are uploaded (multipart when large).
        """
        if isinstance(self.location, PosixLocation) and await asyncio.to_thread(
            _link_into, path, self.location.root / key
        ):
            return
        with _mapped(self, key):
            await obstore.put_async(
                self._store, key, path, chunk_size=CHUNK_BYTES, max_concurrency=4
            )

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key counts as removed."""
        with _mapped(self, key):
            try:
                await obstore.delete_async(self._store, key)
            except FileNotFoundError:
                pass


def _build(location: Location) -> Any:
    retry = {
        "max_retries": MAX_RETRIES,
        "backoff": {"init_backoff": datetime.timedelta(seconds=BACKOFF_S),
                    "max_backoff": datetime.timedelta(seconds=2), "base": 2},
        "retry_timeout": datetime.timedelta(seconds=REQUEST_TIMEOUT_S),
    }
    if isinstance(location, PosixLocation):
        location.root.mkdir(parents=True, exist_ok=True)
        return LocalStore(location.root, mkdir=True)
    config: dict[str, Any] = {"virtual_hosted_style_request": location.virtual_hosted}
    for key, value in (("endpoint", location.endpoint), ("region", location.region),
                       ("access_key_id", location.access_key_id),
                       ("secret_access_key", location.secret_access_key)):
        if value:
            config[key] = value
    client = {
        "allow_http": location.allow_http,
        "timeout": datetime.timedelta(seconds=REQUEST_TIMEOUT_S),
        "connect_timeout": datetime.timedelta(seconds=5),
    }
    return S3Store(location.bucket, prefix=location.prefix or None, config=config,  # type: ignore[arg-type]
                   client_options=client, retry_config=retry)  # type: ignore[arg-type]


@contextlib.contextmanager
def _mapped(store: ObjectStore, key: str) -> Iterator[None]:
    """obstore's exceptions → aenv's, with the repository and key in one line."""
    where = f"repository {store.describe()}: {key}"
    try:
        yield
    except AenvError:
        raise
    except (obx.NotFoundError, FileNotFoundError) as exc:
        raise NotFound(f"{where}: not found") from exc
    except (obx.AlreadyExistsError, FileExistsError) as exc:
        raise AlreadyExists(f"{where}: already exists") from exc
    except (obx.PermissionDeniedError, obx.UnauthenticatedError, PermissionError) as exc:
        raise Unavailable(f"{where}: access denied: {_first_line(exc)}") from exc
    except (obx.BaseError, OSError) as exc:
        raise Unavailable(f"{where}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _link_into(source: Path, final: Path) -> bool:
    """Hard-link ``source`` to ``final`` atomically (link a temporary name, rename it over).

    False when a link is impossible (another filesystem), so the caller copies instead.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.{secrets.token_hex(6)}")
    try:
        os.link(source, temporary)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    try:
        temporary.rename(final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return True
