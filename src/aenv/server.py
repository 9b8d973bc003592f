"""The node server's composition root: settings → store, runtime, storage, network → API.

``aenv server`` (and ``python -m aenv.server``) runs it. Start-up order: the node's locks (its
home, its network-slot range: a second node on either refuses to start, see core/locks.py), API
key, envd bundle, base template (with visible progress), store, network pool, crash recovery,
then serve; the TTL and idle loops and the pool's refill run as supervised tasks. Shutdown leaves
sandboxes running: the next start re-attaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import uvicorn
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from aenv.api.app import NodeApp, build_api
from aenv.cluster.heartbeat import Heartbeat
from aenv.cluster.peer_fetch import PeerBlobs
from aenv.core import faults, ids, proc
from aenv.core.errors import AenvError, FailedPrecondition
from aenv.core.locks import HeldLock, lock_home, lock_slot_range
from aenv.core.settings import Settings
from aenv.edge.limits import BodyLimits
from aenv.edge.protocol import ConnectionLimits, protocol_class
from aenv.envd.bundle import build_bundle
from aenv.network.guest_http import GuestConnector
from aenv.network.pool import NetConfig, SlotPool
from aenv.orchestrator.admission import Admission
from aenv.orchestrator.builder import Builder
from aenv.orchestrator.catalog import TemplateCatalog
from aenv.orchestrator.context import Node
from aenv.orchestrator.deaths import DeathWatch
from aenv.orchestrator.gc import run_gc_loop
from aenv.orchestrator.idle import run_idle_loop
from aenv.orchestrator.liveness import run_liveness_loop
from aenv.orchestrator.owners import Owners
from aenv.orchestrator.paused_repo import publish_pending
from aenv.orchestrator.precreated import PrecreatedPool
from aenv.orchestrator.recover import recover
from aenv.orchestrator.restore_match import host_requirements
from aenv.orchestrator.settle import settle
from aenv.orchestrator.spill import Spiller
from aenv.orchestrator.template_image import with_memory_image
from aenv.orchestrator.ttl import run_ttl_loop
from aenv.orchestrator.warm import WarmPool
from aenv.proxy.app import Proxy
from aenv.runtime import reaper
from aenv.runtime.registry import build_runtime
from aenv.storage.artifacts import Artifacts
from aenv.storage.blobs import BlobCache
from aenv.storage.files import rmtree
from aenv.storage.images import ImageLimits, ImageStore
from aenv.storage.layer_cache import CachePolicy, LayerCache
from aenv.storage.layers import LayerStore
from aenv.storage.mounts import mounts_under, unmount
from aenv.storage.objects import ObjectStore, parse_location
from aenv.storage.reflink_fs import ReflinkPool
from aenv.storage.repository import SnapshotRepository
from aenv.storage.rootfs import RootfsStore
from aenv.storage.skopeo import Skopeo
from aenv.storage.workspaces import WorkspaceStore
from aenv.store.sqlite import Store
from aenv.store.templates import TemplateStore

log = logging.getLogger("aenv.server")

#: Threads of the event loop's default executor (``asyncio.to_thread``).
EXECUTOR_THREADS = 48
console = Console(stderr=True)


def api_key_for(settings: Settings) -> str:
    """The configured key, else the one generated on the first start (kept under home)."""
    if settings.api_key:
        return settings.api_key
    path = settings.home / "api_key"
    if path.exists():
        return path.read_text().strip()
    key = ids.new_api_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


async def _prepare_envd(settings: Settings) -> Path:
    """The envd bundle for new sandboxes, as an immutable per-version copy.

    Running sandboxes bind-mount the bundle directory; a rebuild swaps the build directory, so
    sandboxes get ``<home>/envd/<input hash>``, which never changes once written (hard links,
    so a copy costs no space). Older versions stay for the sandboxes that still use them.
    """
    source = settings.envd_bundle or settings.home / "envd-bundle"
    with console.status("preparing the envd bundle"):
        info = await build_bundle(source)
    versioned = settings.home / "envd" / info.input_hash[:16]
    if not versioned.exists():
        staging = versioned.with_name(versioned.name + ".tmp")
        await asyncio.to_thread(shutil.rmtree, staging, True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        await proc.run(["cp", "-al", str(info.path), str(staging)], timeout=120)
        staging.rename(versioned)
    log.info("envd bundle %s (%s)", versioned, "rebuilt" if info.rebuilt else "up to date")
    return versioned


async def _prepare_templates(catalog: TemplateCatalog) -> None:
    with Progress(
        TextColumn("[bold]base template[/]"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=False,
    ) as progress:
        task = progress.add_task("", total=1.0)

        def on_progress(message: str, fraction: float | None) -> None:
            progress.update(task, description=message[:60],
                            completed=fraction if fraction is not None else None)

        await catalog.prepare(on_progress)


def image_store(settings: Settings, layers: LayerStore, rootfs: RootfsStore) -> ImageStore:
    """Pulled images over the layer store, within the layer cache's budget."""
    skopeo = Skopeo(settings.home / "blobs", auth_file=settings.registry_auth_file,
                    cert_dir=settings.registry_cert_dir)
    holder: list[ImageStore] = []
    cache = LayerCache(
        layers, skopeo.blobs_dir,
        CachePolicy(settings.layer_cache_bytes, settings.layer_cache_high,
                    settings.layer_cache_low),
        sources=lambda: holder[0].layer_sources(), in_use=rootfs.layers_referenced,
    )
    images = ImageStore(
        settings.home, layers, cache, skopeo,
        limits=ImageLimits(max_layer_bytes=settings.max_layer_bytes,
                           max_image_bytes=settings.max_image_bytes),
        insecure_registries=settings.insecure_registries,
        local_roots=settings.local_image_roots,
    )
    holder.append(images)
    return images


def open_repository(settings: Settings, layers: LayerStore) -> SnapshotRepository:
    """The snapshot repository the settings name, with this node's cache of its blobs."""
    location = parse_location(settings.repository_location(), s3=settings.s3_options())
    cache_dir = settings.home / "cache"
    blobs = BlobCache(cache_dir / "blobs", settings.repository_cache_bytes)
    return SnapshotRepository(ObjectStore(location), Artifacts(cache_dir, layers, blobs),
                              staging=settings.home / "staging", images=cache_dir / "images")


async def open_workspaces(settings: Settings) -> WorkspaceStore:
    """The disk-workspace pool of this home (made on first use), leftovers swept."""
    pool = ReflinkPool(settings.home, image_size_bytes=settings.workspace_pool_bytes or None)
    try:
        with console.status("opening the workspace pool"):
            await pool.start()
    except AenvError as exc:
        # One line, not a traceback: the usual cause is a host without loop devices.
        raise SystemExit(
            f"aenv: disk workspaces (workspace=disk, the default) cannot start: {exc.message}. "
            "Fix that, or keep written files in sandbox memory: AENV_WORKSPACE=memory") from None
    workspaces = WorkspaceStore(pool, overcommit=settings.workspace_overcommit,
                                host_watermark_percent=settings.host_disk_watermark_percent,
                                trim_interval_s=settings.workspace_trim_interval_s)
    await workspaces.clean_staging()
    return workspaces


async def _sweep_build_scratch(build_dir: Path) -> None:
    """What a crashed build left: layer views still mounted, temporary tars."""
    scratch = build_dir / "scratch"
    for mount_point in mounts_under(scratch):
        await unmount(mount_point, lazy=True, what="a leftover layer view")
    await asyncio.to_thread(rmtree, scratch)
    for upload in (build_dir / "files").glob(".upload-*"):
        upload.unlink(missing_ok=True)


def join_cluster(node: Node, url: str) -> Heartbeat:
    """The node's heartbeat to the cluster at Redis ``url`` (not started)."""
    from aenv.cluster.redis_client import connect

    heartbeat = Heartbeat(node, connect(url))
    log.info("joining the cluster at %s as node %s (%s)", _redacted(url), heartbeat.node_id,
             heartbeat.address)
    return heartbeat


def join_peers(settings: Settings, heartbeat: Heartbeat) -> PeerBlobs:
    """Peer fetch of blobs from the cluster's other nodes (``peer_fetch``)."""
    from aenv.cluster.redis_client import connect

    assert settings.cluster is not None
    log.info("peer fetch on: blobs come from other nodes before the repository")
    return PeerBlobs(connect(settings.cluster), heartbeat.keys, heartbeat.node_id,
                     api_key_for(settings))


def _redacted(url: str) -> str:
    """``url`` without a password (``redis://:secret@host`` → ``redis://:***@host``)."""
    scheme, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return url
    return f"{scheme}{sep}{auth.split(':', 1)[0]}:***@{host}"


@contextlib.asynccontextmanager
async def running_node(settings: Settings) -> AsyncIterator[Node]:
    settings.home.mkdir(parents=True, exist_ok=True)
    bundle = await _prepare_envd(settings)
    layers = LayerStore(settings.layers_dir or settings.home / "layers")
    repository = open_repository(settings, layers)
    with console.status(f"opening the repository {repository.store.describe()}"):
        for leftover in await repository.start():
            log.info("removed %s, left by an interrupted snapshot", leftover)
    catalog = TemplateCatalog(layers, repository)
    catalog.own_bundle = bundle
    await _prepare_templates(catalog)
    store = await Store.open(settings.home / "state.db")
    pool = SlotPool(NetConfig(
        low=min(max(1, settings.net_pool_size // 2), settings.net_pool_size),
        high=settings.net_pool_size,
        first_index=settings.net_first_index, last_index=settings.net_last_index,
    ))
    guests = GuestConnector()
    disk = settings.workspace == "disk"
    runtime = build_runtime(settings)
    catalog.host = await host_requirements(runtime)
    workspaces = await open_workspaces(settings) if disk else None
    if workspaces is not None:
        catalog.disk_dir = workspaces.pool.path / "snapshots"
    rootfs = RootfsStore(settings.home / "sandboxes", workspaces,
                         disk_mb=settings.disk_size_mb)
    template_store = TemplateStore(store.db)
    catalog.built = template_store
    build_dir = settings.home / "build"
    await _sweep_build_scratch(build_dir)
    images = image_store(settings, layers, rootfs)
    # What a killed unpack, build step or pull left (never visible: layers and blobs appear
    # by rename, but on disk). A live writer of a shared layers dir holds its flock: skipped.
    leftovers = await layers.clean_staging() + await images.skopeo.clean_tmp()
    if leftovers:
        log.info("removed %d leftovers of interrupted unpacks, build steps and pulls",
                 leftovers)
    node = Node(
        settings=settings, store=store, runtime=runtime, pool=pool,
        rootfs=rootfs, templates=catalog, guests=guests,
        envd_bundle=bundle, repository=repository, paused_dir=settings.home / "paused",
        layers=layers, images=images,
        template_store=template_store, build_dir=build_dir,
        host_requirements=catalog.host, workspaces=workspaces,
        admission=Admission(max_starts=settings.max_concurrent_starts,
                            max_waiting=settings.max_queued_starts,
                            retry_after_s=settings.busy_retry_after_s),
        owners=Owners(deadline_s=settings.operation_deadline_s,
                      wait_s=settings.transition_wait_s),
    )
    node.owners.settler = partial(settle, node)
    builder = Builder(node, template_store, files_dir=build_dir / "files",
                      scratch_dir=build_dir / "scratch")
    node.builder = builder
    spiller = Spiller(node)
    node.spiller = spiller
    deaths = DeathWatch(node)
    await pool.start()
    tasks: list[asyncio.Task[None]] = []
    heartbeat: Heartbeat | None = None
    peers: PeerBlobs | None = None
    try:
        plan = await recover(node)
        try:
            swept = await pool.sweep()
        except AenvError as exc:
            # The slots it could not remove stay out of use; the next start sweeps them again.
            log.warning("%s", exc.message)
            swept = []
        log.info("recovered: %d re-attached, %d torn down, %d orphans, %d stale slots, "
                 "%d could not be recovered (torn down)",
                 len(set(plan.reattach) - set(plan.failed)), len(plan.teardown),
                 len(plan.orphans), len(swept), len(plan.failed))
        if published := await publish_pending(node):
            log.info("published %d paused sandboxes to the repository", published)
        failed = await builder.recover()
        if failed:
            log.info("%d template builds were cut short by the restart", failed)
        spiller.start()
        tasks.append(asyncio.create_task(run_ttl_loop(node), name="ttl"))
        tasks.append(asyncio.create_task(run_idle_loop(node), name="idle"))
        tasks.append(asyncio.create_task(run_liveness_loop(node), name="liveness"))
        tasks.append(asyncio.create_task(reaper.sweep(), name="reaper"))
        if settings.gc_interval_s:
            tasks.append(asyncio.create_task(run_gc_loop(node), name="gc"))
        if workspaces is not None:
            tasks.append(asyncio.create_task(workspaces.trimmer.run(), name="pool-trim"))
        deaths.start()
        base = await catalog.resolve(settings.default_template)
        with console.status("preparing the base template's memory image"):
            base = await with_memory_image(node, base)
        catalog.use_image(base)
        warm = WarmPool(node, base, settings.warm_pool_size, settings.warm_pool_low)
        node.warm = warm
        warm.start()
        precreated = PrecreatedPool(node, settings.precreate_pool_size, base)
        node.precreated = precreated
        precreated.start()
        if settings.cluster:
            heartbeat = join_cluster(node, settings.cluster)
            heartbeat.start()
            if settings.peer_fetch:
                peers = join_peers(settings, heartbeat)
                node.repository.cache.peers = peers
        yield node
    finally:
        if heartbeat is not None:
            await heartbeat.close()
        if peers is not None:
            node.repository.cache.peers = None
            await peers.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await deaths.close()
        await builder.close()
        await spiller.close()
        await node.owners.close()
        if node.warm is not None:
            with contextlib.suppress(Exception):
                await warm.close()
        if node.precreated is not None:
            with contextlib.suppress(Exception):
                await node.precreated.close()
        await pool.close()
        await guests.aclose()
        await store.close()


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT once it has shut down, which kills the process before
    our own clean-up (warm pool, network pool, store) runs. Stop serving, never re-raise."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def take_locks(settings: Settings) -> list[HeldLock]:
    """The home, then the slot range; held until the process exits (the kernel drops them
    however it exits). Raises ``FailedPrecondition`` naming the other node."""
    home = lock_home(settings.home)
    try:
        return [home, lock_slot_range(settings.net_first_index, settings.net_last_index)]
    except BaseException:
        home.release()
        raise


async def serve(settings: Settings) -> None:
    """Run the node until SIGTERM or SIGINT. Prerequisites: ``take_locks`` succeeded."""
    key = api_key_for(settings)
    # asyncio's default executor has cpu + 4 threads (6 here): a fork's 16 children queue
    # their clones, fsyncs and mount-record writes behind each other in it. The work is
    # waiting on disks and the kernel, not CPU, so more threads cost nothing.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="aenv-io"))
    async with running_node(settings) as node:
        proxy = Proxy(node)
        app = NodeApp(build_api(node, key), proxy, BodyLimits.of(settings))
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, loop="asyncio",
            # httptools, guarded: head size, header-read timeout, slow connections per client.
            http=protocol_class(ConnectionLimits.of(settings)),
            ws="websockets-sansio", lifespan="off", access_log=False, log_level=settings.log_level,
            timeout_keep_alive=settings.idle_timeout_s, server_header=False,
        )
        server = _Server(config)
        console.print(f"[bold green]aenv[/] serving on http://{settings.listen}  "
                      f"(E2B_API_URL=E2B_SANDBOX_URL=http://{settings.listen})")
        if not settings.api_key:
            console.print(f"API key: [bold]{key}[/] (stored in {settings.home / 'api_key'})")
        try:
            await server.serve()
        finally:
            await proxy.aclose()


def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # One line per proxied request is noise at info level.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    faults.arm(settings.crash_at)
    # asyncio's own loop, not uvloop: every runsc, mount, ip and nft call is a subprocess, and
    # libuv spawns by fork(): 15 ms and 11 ms of CPU per spawn from this process, against 4 ms
    # and 3 ms with asyncio (subprocess's vfork). A resume hot is one spawn.
    try:
        locks = take_locks(settings)
    except FailedPrecondition as exc:
        # A second node on this home or these slots: one line, no traceback, exit status 1,
        # and nothing of the first node touched.
        raise SystemExit(f"aenv: {exc.message}") from None
    # runsc's sandbox and gofer processes are re-parented to us, not to PID 1, and reaped as
    # soon as they exit (runtime/reaper.py): a kill no longer waits for a slow init.
    reaper.become_subreaper()
    try:
        asyncio.run(serve(settings))
    finally:
        for lock in reversed(locks):
            lock.release()


if __name__ == "__main__":
    main()
