"""Opening the node's parts, each from the settings: the envd bundle, the base template, the
repository and its blob cache, pulled images over the layer store, the disk-workspace pool,
what an interrupted build left. ``root.py`` assembles them."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from aenv.core import ids, proc
from aenv.core.errors import AenvError
from aenv.core.settings import Settings
from aenv.envd.bundle import build_bundle
from aenv.orchestrator.catalog import TemplateCatalog
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

log = logging.getLogger("aenv.compose")
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


async def prepare_envd(settings: Settings) -> Path:
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


async def prepare_templates(catalog: TemplateCatalog) -> None:
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


async def sweep_build_scratch(build_dir: Path) -> None:
    """What a crashed build left: layer views still mounted, temporary tars."""
    scratch = build_dir / "scratch"
    for mount_point in mounts_under(scratch):
        await unmount(mount_point, lazy=True, what="a leftover layer view")
    await asyncio.to_thread(rmtree, scratch)
    for upload in (build_dir / "files").glob(".upload-*"):
        upload.unlink(missing_ok=True)
