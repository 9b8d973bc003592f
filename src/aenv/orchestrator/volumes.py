"""Persistent volumes: E2B's ``/volumes`` and its content API over the repository, and the
mounts of sandboxes created with ``volumeMounts``.

The model (docs/volumes.md):

- **A volume lives in the repository** (``storage/volume_catalog.py``): its name, size and last
  committed image, seen by every node. To be used — mounted by a sandbox or read and written
  through the content API — it is **checked out** by one node at a time: that node holds it
  in the repository, has its image (``storage/volume_images.py``) and mounts it on the host.
- **Users.** Each sandbox of this node that mounts the volume (running or paused) is a user,
  read-write or read-only, and so is each content request while it runs. **One read-write
  sandbox at a time**: a second gets ``Conflict`` (409). Read-only mounts may be many, and
  fork children get the parent's volumes read-only. Content writes are refused (409) while a
  sandbox has the volume read-write (two writers on one file system would race).
- **Release.** A volume with no user for ``volume_idle_release_s`` is unmounted, committed
  (its image's chunks to the repository) and released; another node may then check it out.
  A volume held by another node answers 409 here, naming that node.
- **Delete** is refused (409) while any sandbox has the volume mounted; otherwise it is gone
  from the repository first, then from this node.

Owns: the users (in memory; re-made from the sandboxes' records at start), one lock per
volume (check-out, release and delete of one volume never overlap).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import posixpath
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import AenvError, AlreadyExists, Conflict, InvalidArgument
from aenv.core.ids import new_volume_id
from aenv.core.keyed_locks import KeyedLocks
from aenv.core.settings import Settings
from aenv.core.states import SandboxState
from aenv.envd.volume_binds import SLOTS, SLOTS_DIR, slot_count
from aenv.runtime.base import ENVD_MOUNT, VolumeBind
from aenv.storage.volume_catalog import VolumeCatalog, VolumeManifest
from aenv.storage.volume_images import VolumeImages
from aenv.store.sqlite import Store

log = logging.getLogger("aenv.orchestrator.volumes")

NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_NAME = 250


def name_ok(name: str) -> bool:
    """Whether ``name`` is a well-formed volume name."""
    return bool(NAME.match(name)) and len(name) <= MAX_NAME
#: No volume over these: the sandbox needs them (``/`` would hide its whole root).
_RESERVED = ("/", "/proc", "/sys", "/dev", posixpath.dirname(ENVD_MOUNT),
             posixpath.dirname(SLOTS_DIR))


@dataclass(frozen=True)
class MountRequest:
    """One ``volumeMounts`` entry as the client sent it."""

    name: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class Mounted:
    """One volume of a sandbox: what its record keeps and what its runtime spec binds."""

    name: str
    path: str
    volume_id: str
    read_only: bool

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "path": self.path, "volume_id": self.volume_id,
                "read_only": self.read_only}

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> Mounted:
        return cls(name=str(raw["name"]), path=str(raw["path"]),
                   volume_id=str(raw["volume_id"]), read_only=bool(raw.get("read_only")))


def mounts_of(raw: Sequence[dict[str, object]] | None) -> list[Mounted]:
    return [Mounted.from_json(m) for m in raw or ()]


def slot_binds(envd_bundle: Path, mounted: Sequence[Mounted]) -> list[dict[str, object]]:
    """envd's ``/init`` ``volumeMounts``: the k-th volume is in slot k (``Volumes.binds``
    keeps the order; ``envd/volume_binds.py``). None for a bundle without slots (its
    sandboxes have their volumes bound at their paths by the runtime)."""
    if not mounted or not slot_count(envd_bundle):
        return []
    return [{"slot": k, "path": m.path, "readOnly": m.read_only}
            for k, m in enumerate(mounted)]


class Volumes:
    def __init__(self, settings: Settings, catalog: VolumeCatalog, images: VolumeImages,
                 node_id: str) -> None:
        self.settings = settings
        self.catalog = catalog
        self.images = images
        self.node_id = node_id
        self._locks = KeyedLocks()
        #: volume id → user → read-only (users: sandbox ids, and ``content-<n>``).
        self._users: dict[str, dict[str, bool]] = {}
        #: volume id → monotonic time its last user left (the idle release counts from it).
        self._idle_since: dict[str, float] = {}
        self._content = itertools.count()
        #: Volumes this process checked out (its holds it knows to be its own): id → name.
        self._held: dict[str, str] = {}

    # -- the control plane -------------------------------------------------------------------

    async def create(self, name: str, size_mb: int | None = None,
                     team_id: str | None = None) -> VolumeManifest:
        if not name_ok(name):
            raise InvalidArgument("Invalid volume name: use letters, digits, '-' and '_' "
                                  f"(at most {MAX_NAME})")
        size = size_mb or self.settings.volume_default_size_mb
        if not 16 <= size <= self.settings.volume_max_size_mb:
            raise InvalidArgument(f"a volume's size is 16 to {self.settings.volume_max_size_mb}"
                                  f" MB, not {size}")
        try:
            return await self.catalog.create(new_volume_id(), name, size << 20, team_id)
        except AlreadyExists as exc:
            raise InvalidArgument(exc.message) from None  # E2B answers a taken name 400

    async def list(self) -> builtins.list[VolumeManifest]:
        return await self.catalog.list()

    async def get(self, volume_id: str) -> VolumeManifest:
        return await self.catalog.require(volume_id)

    async def delete(self, volume_id: str) -> None:
        async with self._locks.hold(volume_id):
            manifest = await self.catalog.require(volume_id)
            sandboxes = sorted(u for u in self._users.get(volume_id, {})
                               if not u.startswith("content-"))
            if sandboxes:
                raise Conflict(f"volume {manifest.name} is mounted by sandbox "
                               f"{', '.join(sandboxes)}; kill it first")
            holder = await self.catalog.holder(volume_id)
            if holder not in (None, self.node_id):
                raise Conflict(f"volume {manifest.name} is in use on node {holder}")
            self._held.pop(volume_id, None)
            await self.catalog.delete(manifest)
            await self.images.remove(volume_id)
            self._users.pop(volume_id, None)
            self._idle_since.pop(volume_id, None)
            log.info("deleted volume %s (%s)", volume_id, manifest.name)

    def held_names(self) -> builtins.list[str]:
        """Names of the volumes checked out here (the heartbeat's: a cluster places a create
        that mounts one of them on this node, where it can be mounted at once)."""
        return sorted(self._held.values())

    # -- the content plane -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def content(self, volume_id: str, *, write: bool) -> AsyncIterator[Path]:
        """The volume's root on the host, checked out here for the length of one request."""
        user = f"content-{next(self._content)}"
        async with self._locks.hold(volume_id):
            # ``_check_out`` reads the repository unless this node holds the volume already
            # (then no other node may have changed or deleted it).
            if write and (writer := self._writer(volume_id)) is not None:
                raise Conflict(f"volume {volume_id} is mounted read-write by sandbox {writer};"
                               " write to it there, or after that sandbox ends")
            root = await self._check_out(volume_id)
            self._use(volume_id, user, read_only=not write)
        try:
            yield root
        finally:
            self._leave(volume_id, user)

    # -- sandboxes ---------------------------------------------------------------------------

    async def attach(self, sandbox_id: str, requests: Sequence[MountRequest],
                     team_id: str | None = None) -> builtins.list[Mounted]:
        """Check the requests (E2B's rules and messages; names are ``team_id``'s), check every
        volume out here and make ``sandbox_id`` its user. On failure nothing is attached."""
        manifests = await self._validate(requests, team_id)
        mounted = [Mounted(r.name, r.path, manifests[r.name].volume_id, r.read_only)
                   for r in requests]
        try:
            await self.adopt(sandbox_id, mounted)
        except BaseException:
            await asyncio.shield(self.detach(sandbox_id))
            raise
        return mounted

    async def adopt(self, sandbox_id: str, mounted: Sequence[Mounted]) -> None:
        """Make ``sandbox_id`` a user of its volumes (an attach, a fork child, a restart)."""
        for m in mounted:
            async with self._locks.hold(m.volume_id):
                if not m.read_only and (writer := self._writer(m.volume_id)) not in (
                        None, sandbox_id):
                    raise Conflict(
                        f"volume '{m.name}' is mounted read-write by sandbox {writer}: mount "
                        "it read-only (readOnly: true), or after that sandbox ends")
                await self._check_out(m.volume_id)
                if m.read_only:
                    await self.images.make_view(m.volume_id, sandbox_id)
                self._use(m.volume_id, sandbox_id, read_only=m.read_only)

    def binds(self, sandbox_id: str, mounted: Sequence[Mounted]) -> tuple[VolumeBind, ...]:
        """What the runtime binds: the volume's mount, or for a reader its read-only view
        (the runtime's own ``ro`` is not enough: root inside may remount, and a restore keeps
        the flags of its checkpoint — a fork child's are its writing parent's)."""
        return tuple(
            VolumeBind(self.images.view(m.volume_id, sandbox_id) if m.read_only
                       else self.images.mount_point(m.volume_id), m.path, m.read_only)
            for m in mounted)

    async def detach(self, sandbox_id: str) -> None:
        """``sandbox_id`` uses none of its volumes any more (killed, or never started)."""
        await self.images.drop_views(sandbox_id)
        for volume_id in [v for v, users in self._users.items() if sandbox_id in users]:
            self._leave(volume_id, sandbox_id)

    async def recover(self, store: Store) -> None:
        """At start: every sandbox record that mounts volumes is their user again."""
        for record in await store.list([s for s in SandboxState if s != SandboxState.KILLING]):
            if record.volume_mounts:
                try:
                    await self.adopt(record.sandbox_id, mounts_of(record.volume_mounts))
                except AenvError as exc:
                    log.warning("sandbox %s keeps its volumes unmounted: %s",
                                record.sandbox_id, exc.message)

    # -- the idle release --------------------------------------------------------------------

    async def release_idle(self) -> None:
        """Commit and release every volume checked out here that nobody used for a while."""
        now = time.monotonic()
        for volume_id, since in list(self._idle_since.items()):
            if now - since < self.settings.volume_idle_release_s:
                continue
            async with self._locks.hold(volume_id):
                if self._users.get(volume_id) or self._idle_since.get(volume_id) != since:
                    continue
                try:
                    await self._release(volume_id)
                except AenvError as exc:
                    log.warning("releasing volume %s failed, tried again later: %s",
                                volume_id, exc.message)
                    self._idle_since[volume_id] = time.monotonic()
                    continue
                self._idle_since.pop(volume_id, None)

    async def run_release_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(self.settings.volume_idle_release_s / 3, 10.0)))
            await self.release_idle()

    async def release_all(self) -> None:
        """A node being drained or stopped: every volume nobody uses goes back."""
        for volume_id in list(self._idle_since):
            async with self._locks.hold(volume_id):
                if not self._users.get(volume_id):
                    with contextlib.suppress(AenvError):
                        await self._release(volume_id)
                        self._idle_since.pop(volume_id, None)

    # -- inside ------------------------------------------------------------------------------

    def _writer(self, volume_id: str) -> str | None:
        return next((u for u, ro in self._users.get(volume_id, {}).items()
                     if not ro and not u.startswith("content-")), None)

    def _use(self, volume_id: str, user: str, *, read_only: bool) -> None:
        users = self._users.setdefault(volume_id, {})
        # A sandbox mounting one volume at two paths, one read-write: it writes.
        users[user] = users.get(user, True) and read_only
        self._idle_since.pop(volume_id, None)

    def _leave(self, volume_id: str, user: str) -> None:
        users = self._users.get(volume_id)
        if users is None:
            return
        users.pop(user, None)
        if not users:
            del self._users[volume_id]
            self._idle_since[volume_id] = time.monotonic()

    async def _check_out(self, volume_id: str) -> Path:
        """Hold the volume for this node, make sure its image is here, mount it. Under its
        lock. A node that already held it has the newest image (it commits on release)."""
        if volume_id in self._held and self.images.mounted(volume_id):
            # Nobody else can have changed or deleted it while this node holds it.
            return self.images.mount_point(volume_id)
        manifest = await self.catalog.require(volume_id)
        held_before = await self.catalog.holder(volume_id) == self.node_id
        await self.catalog.hold(volume_id, self.node_id)
        try:
            if not (held_before and self.images.has_image(volume_id)):
                await self._fetch(manifest)
            mounted = await self.images.mount(volume_id)
            self._held[volume_id] = manifest.name
            return mounted
        except BaseException:
            if not held_before:
                with contextlib.suppress(Exception):
                    await self.catalog.release(volume_id, self.node_id)
            raise

    async def _fetch(self, manifest: VolumeManifest) -> None:
        await self.images.unmount(manifest.volume_id)
        if manifest.version == 0:
            self.images.image(manifest.volume_id).unlink(missing_ok=True)
            await self.images.make(manifest.volume_id, manifest.size_bytes)
            return
        staged = self.images.staged_path(manifest.volume_id)
        try:
            await self.catalog.fetch(manifest, staged)
            self.images.place(staged, manifest.volume_id)
        finally:
            staged.unlink(missing_ok=True)
        log.info("fetched volume %s version %d (%d chunks)", manifest.volume_id,
                 manifest.version, len(manifest.chunks))

    async def _release(self, volume_id: str) -> None:
        self._held.pop(volume_id, None)
        manifest = await self.catalog.get(volume_id)
        if manifest is None:  # deleted meanwhile (by another node: it was not held here)
            await self.images.remove(volume_id)
            return
        await self.images.unmount(volume_id)
        if self.images.has_image(volume_id):
            committed = await self.catalog.commit(manifest, self.images.image(volume_id))
            log.info("committed volume %s version %d (%d chunks)", volume_id,
                     committed.version, len(committed.chunks))
        await self.catalog.release(volume_id, self.node_id)
        await self.images.remove(volume_id)

    async def _validate(self, requests: Sequence[MountRequest],
                        team_id: str | None) -> dict[str, VolumeManifest]:
        problems: list[str] = []
        found: dict[str, VolumeManifest] = {}
        seen: set[str] = set()
        for index, r in enumerate(requests):
            reason = None
            if r.name not in found:
                manifest = (await self.catalog.by_name(r.name, team_id)
                            if NAME.match(r.name) else None)
                if manifest is None:
                    reason = f"volume '{r.name}' not found"
                else:
                    found[r.name] = manifest
            if reason is None:
                reason = _path_problem(r.path, seen)
            if reason is not None:
                problems.append(f"volume mount #{index}: {reason}")
            seen.add(r.path)
        if len(requests) > SLOTS:
            problems.append(f"a sandbox mounts at most {SLOTS} volumes, not {len(requests)}")
        if problems:
            raise InvalidArgument("invalid mounts:\n\t- " + "\n\t- ".join(problems))
        return found


def _path_problem(path: str, seen: set[str]) -> str | None:
    if not path:
        return "path cannot be empty"
    if not path.startswith("/"):
        return "path must be absolute"
    if posixpath.normpath(path) != path or "\0" in path:
        return "path must not contain any '.' or '..' components"
    if any(path == r or path.startswith(r.rstrip("/") + "/") for r in _RESERVED[1:]) or (
            path == "/"):
        return f"path '{path}' is reserved for the sandbox's own use"
    if path in seen:
        return f"path '{path}' is already used"
    return None
