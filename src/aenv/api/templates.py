"""The template-build API (e2b-compat §2.4.10; the SDK's ``Template.build``) and the routes
around templates: files, builds and their status, aliases, tags, list, delete.

A name is E2B's alias: ``POST /v3/templates`` with a known name makes a new build of that
template. Uploads go to a signed URL (the SDK sends no API key with the ``PUT``): HMAC of the
template, hash and expiry under the node's API key, valid for an hour.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from aenv.api.auth import require_api_key
from aenv.api.convert import sandbox_out
from aenv.api.node import NodeDep
from aenv.api.schemas import SandboxOut
from aenv.api.template_schemas import (
    AssignedTags,
    AssignTags,
    BuildLogEntry,
    BuildStatusReason,
    ColdSandbox,
    DeleteTags,
    TemplateAliasResponse,
    TemplateBuildFileUpload,
    TemplateBuildInfo,
    TemplateBuildRequestV3,
    TemplateBuildStartV2,
    TemplateOut,
    TemplateRequestResponseV3,
    TemplateTagOut,
)
from aenv.core.errors import (
    AlreadyExists,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotEnoughSpace,
    NotFound,
    PermissionDenied,
)
from aenv.edge.limits import check_sandbox_inputs
from aenv.envd import ENVD_VERSION
from aenv.orchestrator.builder import Builder
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.cold_start import cold_start
from aenv.orchestrator.ops.create import CreateParams
from aenv.store.templates import DEFAULT_TAG, BuildRecord, LogEntry, TemplateRecord, TemplateStore
from aenv.templates.dockerfile import plan_from_dockerfile
from aenv.templates.e2b_steps import check_files_hash, plan_from_e2b

router = APIRouter(dependencies=[Depends(require_api_key)])
uploads = APIRouter()

UPLOAD_URL_TTL_S = 3600
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace(
        "+00:00", "Z")


def _store(node: Node) -> TemplateStore:
    if node.template_store is None:
        raise FailedPrecondition("this node does not build templates")
    return node.template_store


def _builder(node: Node) -> Builder:
    builder = node.builder
    if builder is None:
        raise FailedPrecondition("this node does not build templates")
    return builder


def _files_dir(node: Node) -> Path:
    if node.build_dir is None:
        raise FailedPrecondition("this node does not build templates")
    return node.build_dir / "files"


def split_name(name: str) -> tuple[str, str | None]:
    """``name[:tag]`` → (name, tag); E2B's names may carry a tag after a colon."""
    base, sep, tag = name.partition(":")
    return base, (tag if sep else None)


def _check_name(name: str) -> str:
    if not _NAME.match(name) or name == "base":
        raise InvalidArgument(
            f"invalid template name {name!r} (1-128 of a-z 0-9 . _ -, starting with a letter or "
            "digit; 'base' is built in)")
    return name


def _check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise InvalidArgument(f"invalid tag {tag!r}")
    return tag


def _sign(key: str, template_id: str, files_hash: str, expires: int) -> str:
    message = f"{template_id}:{files_hash}:{expires}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


async def _template(store: TemplateStore, template_id: str) -> TemplateRecord:
    record = await store.get_template(split_name(template_id)[0])
    if record is None:
        raise NotFound(f"template '{template_id}' not found")
    return record


@router.post("/v3/templates", status_code=202, response_model=TemplateRequestResponseV3)
async def request_build(body: TemplateBuildRequestV3, node: NodeDep) -> TemplateRequestResponseV3:
    store = _store(node)
    name, tag = split_name(body.name)
    _check_name(name)
    tags = [_check_tag(t) for t in [*(body.tags or []), *([tag] if tag else [])]]
    now = time.time()
    cpu = body.cpu_count or node.settings.default_cpu_count
    memory = body.memory_mb or node.settings.default_memory_mb
    record = await store.get_template(name)
    if record is None:
        fresh = TemplateRecord(
            template_id="".join(secrets.choice(_ALPHABET) for _ in range(20)), name=name,
            created_at=now, updated_at=now, cpu_count=cpu, memory_mb=memory)
        try:
            await store.insert_template(fresh)
            record = fresh
        except AlreadyExists:
            record = await store.require_template(name)  # a concurrent request made it first
    if record.cpu_count != cpu or record.memory_mb != memory:
        record = await store.update_template(record, cpu_count=cpu, memory_mb=memory)
    build = BuildRecord(build_id=str(uuid.uuid4()), template_id=record.template_id,
                        status="waiting", created_at=now, updated_at=now, cpu_count=cpu,
                        memory_mb=memory)
    await store.insert_build(build)
    _builder(node).requested_tags[build.build_id] = tags
    return TemplateRequestResponseV3(
        templateID=record.template_id, buildID=build.build_id, public=record.public,
        names=[record.name], tags=tags or [DEFAULT_TAG], aliases=[record.name])


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201,
            response_model=TemplateBuildFileUpload, response_model_exclude_none=True)
async def file_upload_link(
    template_id: str, files_hash: str, request: Request, node: NodeDep
) -> TemplateBuildFileUpload:
    record = await _template(_store(node), template_id)
    check_files_hash(files_hash)
    if (_files_dir(node) / files_hash).is_file():
        return TemplateBuildFileUpload(present=True)
    expires = int(time.time()) + UPLOAD_URL_TTL_S
    signature = _sign(request.app.state.api_key, record.template_id, files_hash, expires)
    url = str(request.url_for("upload_files", template_id=record.template_id,
                              files_hash=files_hash).include_query_params(
        expires=expires, signature=signature))
    return TemplateBuildFileUpload(present=False, url=url, headers={})


@uploads.put("/templates/{template_id}/files/{files_hash}/upload", name="upload_files")
async def upload_files(
    template_id: str, files_hash: str, request: Request, expires: int = 0, signature: str = ""
) -> Response:
    node: Node = request.app.state.node
    check_files_hash(files_hash)
    wanted = _sign(request.app.state.api_key, template_id, files_hash, expires)
    if not hmac.compare_digest(wanted, signature):
        raise PermissionDenied("invalid upload signature")
    if expires < time.time():
        raise PermissionDenied("the upload URL has expired")
    limit = node.settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise NotEnoughSpace(f"upload of {declared} bytes exceeds the limit of {limit}")
    files = _files_dir(node)
    files.mkdir(parents=True, exist_ok=True)
    partial = files / f".upload-{secrets.token_hex(8)}"
    written = 0
    try:
        with open(partial, "wb") as fh:
            async for chunk in request.stream():
                written += len(chunk)
                if written > limit:
                    raise NotEnoughSpace(f"upload exceeds the limit of {limit} bytes")
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        partial.replace(files / files_hash)
    finally:
        partial.unlink(missing_ok=True)
    return Response(status_code=201)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(
    template_id: str, build_id: str, body: TemplateBuildStartV2, node: NodeDep,
) -> Response:
    store = _store(node)
    builder = _builder(node)
    record = await _template(store, template_id)
    build = await store.require_build(record.template_id, build_id)
    if build.status != "waiting" or builder.running(build_id):
        raise Conflict(f"build {build_id} was already started")
    if body.dockerfile is not None:
        if not body.context_hash:
            raise InvalidArgument("a Dockerfile build needs the contextHash of its upload")
        check_files_hash(body.context_hash)
        plan, warnings = plan_from_dockerfile(
            body.dockerfile, context_hash=body.context_hash, build_args=body.build_args,
            target=body.target)
        if body.force:
            plan = type(plan)(stages=plan.stages, start_cmd=plan.start_cmd,
                              ready_cmd=plan.ready_cmd, force=True)
    else:
        plan = plan_from_e2b(
            from_image=body.from_image, from_template=body.from_template,
            registry=body.from_image_registry.model_dump() if body.from_image_registry
            else None,
            steps=[s.model_dump(by_alias=True) for s in body.steps],
            start_cmd=body.start_cmd, ready_cmd=body.ready_cmd, force=body.force)
        warnings = []
    for stage in plan.stages:
        for step in stage.steps:
            if step.files_hash and not (_files_dir(node) / step.files_hash).is_file():
                raise InvalidArgument(
                    f"the files of COPY {step.args[0]} (hash {step.files_hash}) were not "
                    "uploaded")
    for warning in warnings:
        await store.append_log(build_id, "warn", warning, "base")
    auth = None
    if body.from_image_registry and body.from_image_registry.username:
        auth = (body.from_image_registry.username, body.from_image_registry.password or "")
    builder.start(record, build, plan, tags=builder.requested_tags.pop(build_id, []), auth=auth)
    return Response(status_code=202)


def _entry(entry: LogEntry) -> BuildLogEntry:
    return BuildLogEntry(timestamp=_iso(entry.at), level=entry.level, message=entry.message,
                         step=entry.step)


@router.get("/templates/{template_id}/builds/{build_id}/status",
            response_model=TemplateBuildInfo, response_model_exclude_none=True)
async def build_status(
    template_id: str, build_id: str, node: NodeDep,
    logsOffset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=100)] = 100,
    level: str | None = None,
) -> TemplateBuildInfo:
    store = _store(node)
    record = await _template(store, template_id)
    build = await store.require_build(record.template_id, build_id)
    if level is not None and level not in ("debug", "info", "warn", "error"):
        raise InvalidArgument("level must be debug, info, warn or error")
    entries = await store.logs(build_id, offset=logsOffset, limit=limit, level=level)
    reason = None
    if build.status == "error":
        reason = BuildStatusReason(message=build.reason or "the build failed",
                                   step=build.reason_step)
    return TemplateBuildInfo(
        templateID=record.template_id, buildID=build_id, status=build.status,
        logs=[f"[{_iso(e.at)}] {e.message}" for e in entries],
        logEntries=[_entry(e) for e in entries], reason=reason)


@router.get("/templates/aliases/{alias}", response_model=TemplateAliasResponse)
async def alias(alias: str, node: NodeDep) -> TemplateAliasResponse:
    record = await _store(node).get_template(split_name(alias)[0])
    if record is None:
        raise NotFound(f"template alias '{alias}' not found")
    return TemplateAliasResponse(templateID=record.template_id, public=record.public)


async def template_out(store: TemplateStore, record: TemplateRecord, node: Node
                       ) -> TemplateOut:
    builds = await store.builds(record.template_id)
    default = await store.tagged_build(record.template_id, DEFAULT_TAG)
    shown = next((b for b in builds if b.build_id == default), builds[0] if builds else None)
    return TemplateOut(
        templateID=record.template_id, buildID=shown.build_id if shown else "",
        cpuCount=record.cpu_count, memoryMB=record.memory_mb,
        diskSizeMB=node.settings.disk_size_mb, public=record.public, aliases=[record.name],
        names=[record.name], createdAt=_iso(record.created_at),
        updatedAt=_iso(record.updated_at),
        lastSpawnedAt=_iso(record.last_spawned_at) if record.last_spawned_at else None,
        spawnCount=record.spawn_count, buildCount=len(builds), envdVersion=ENVD_VERSION,
        buildStatus=shown.status if shown else "waiting",
    )


@router.get("/templates", response_model=list[TemplateOut])
async def list_templates(node: NodeDep) -> list[TemplateOut]:
    store = _store(node)
    return [await template_out(store, r, node) for r in await store.list_templates()]


@router.get("/templates/{template_id}/tags", response_model=list[TemplateTagOut])
async def list_tags(template_id: str, node: NodeDep) -> list[TemplateTagOut]:
    store = _store(node)
    record = await _template(store, template_id)
    return [TemplateTagOut(tag=t, buildID=b, createdAt=_iso(at))
            for t, b, at in await store.tags(record.template_id)]


@router.post("/templates/tags", status_code=201, response_model=AssignedTags)
async def assign_tags(body: AssignTags, node: NodeDep) -> AssignedTags:
    store = _store(node)
    name, tag = split_name(body.target)
    record = await _template(store, name)
    build_id = await store.tagged_build(record.template_id, tag or DEFAULT_TAG)
    if build_id is None:
        raise NotFound(f"template '{body.target}' has no build with that tag")
    tags = [_check_tag(t) for t in body.tags]
    for t in tags:
        await store.set_tag(record.template_id, t, build_id)
    return AssignedTags(buildID=build_id, tags=tags)


@router.delete("/templates/tags", status_code=204)
async def delete_tags(body: DeleteTags, node: NodeDep) -> Response:
    store = _store(node)
    record = await _template(store, body.name)
    for tag in body.tags:
        if tag == DEFAULT_TAG:
            raise InvalidArgument("the default tag cannot be removed")
        await store.remove_tag(record.template_id, tag)
    return Response(status_code=204)


async def delete_built_template(node: Node, name_or_id: str) -> bool:
    """Delete a built template (records and memory images); False if there is none. Its
    layers stay for the layer cache to account (other templates may share them)."""
    store = node.template_store
    if store is None:
        return False
    record = await store.get_template(split_name(name_or_id)[0])
    if record is None:
        return False
    builder = _builder(node)
    for build in await store.builds(record.template_id):
        if builder.running(build.build_id):
            raise Conflict(f"template '{record.name}' is being built; try again when it ends")
    for build in await store.builds(record.template_id):
        if build.snapshot_id and node.repository.get(build.snapshot_id) is not None:
            await node.repository.delete(build.snapshot_id)
    await store.delete_template(record.template_id)
    return True


@router.post("/sandboxes-cold", status_code=201, response_model=SandboxOut)
async def create_cold(body: ColdSandbox, node: NodeDep) -> SandboxOut:
    """AgentENV's cold start: a sandbox straight from an OCI image (``ops/cold_start.py``)."""
    timeout = node.settings.default_timeout_s if body.timeout is None else body.timeout
    if timeout > node.settings.max_timeout_s:
        raise InvalidArgument(
            f"timeout {timeout}s exceeds the maximum of {node.settings.max_timeout_s}s")
    check_sandbox_inputs(node.settings, body.metadata, body.env_vars)
    params = CreateParams(
        template=body.image, timeout_s=timeout, metadata=body.metadata or {},
        env_vars=body.env_vars or {},
        auto_pause=node.settings.auto_pause_default if body.auto_pause is None
        else body.auto_pause,
        allow_internet_access=body.allow_internet_access, network=body.network,
    )
    auth = None
    if body.registry is not None and body.registry.username:
        auth = (body.registry.username, body.registry.password or "")
    record = await cold_start(node, body.image, params, cpu_count=body.cpu_count,
                              memory_mb=body.memory_mb, start_cmd=body.start_cmd, auth=auth)
    return sandbox_out(record, node.settings)


@router.get("/images")
async def list_images(node: NodeDep) -> list[dict[str, object]]:
    """aenv's own view of the image cache: every pulled reference, how much of it is on disk
    now, and the last progress line of pulls under way (``pulling``)."""
    if node.images is None:
        return []
    images = node.images
    records = await asyncio.to_thread(images.records)
    progress = images.in_flight()
    found: list[dict[str, object]] = []
    for pulled, _ in records:
        ids = [d.diff_id.partition(":")[2] for d in pulled.layers]
        found.append({
            "reference": pulled.source, "manifestDigest": pulled.manifest_digest,
            "layers": len(ids), "layersCached": sum(images.layers.has(i) for i in ids),
            "compressedBytes": sum(d.size for d in pulled.layers),
            "progress": progress.pop(pulled.source, None),
        })
    found.extend({"reference": ref, "progress": line} for ref, line in progress.items())
    return found
