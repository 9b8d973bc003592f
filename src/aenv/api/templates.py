"""The template-build API (e2b-compat §2.4.10; the SDK's ``Template.build``) and the routes
around templates: files, builds and their status, aliases, tags, list, delete, and aenv's
cold start and image list.

Handlers parse, call one operation (``orchestrator/ops/template_*.py``, ``cold_start.py``,
``images.py``) and shape its answer; they touch no store, repository or file themselves.
Uploads go to a signed URL (the SDK sends no API key with the ``PUT``): HMAC of the template,
hash and expiry under the node's API key, valid for an hour. Signing is this module's: it is
the upload's authentication, as the ``X-API-KEY`` check is the other routes'.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from aenv.api.auth import CallerDep, require_operator
from aenv.api.convert import iso, sandbox_out
from aenv.api.node import NodeDep, node_of
from aenv.api.ownership import guard_path, require_template, sees_template
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
from aenv.core.errors import Conflict, PermissionDenied
from aenv.core.settings import Settings
from aenv.core.timeouts import timeout_or_default
from aenv.edge.limits import check_sandbox_inputs
from aenv.envd import ENVD_VERSION
from aenv.orchestrator.ops import images as images_op
from aenv.orchestrator.ops import template_build as build_op
from aenv.orchestrator.ops import template_catalog as catalog_op
from aenv.orchestrator.ops import template_files as files_op
from aenv.orchestrator.ops.cold_start import cold_start
from aenv.orchestrator.ops.create import CreateParams
from aenv.orchestrator.tenancy import Owned
from aenv.templates.e2b_steps import check_files_hash

router = APIRouter(dependencies=[Depends(guard_path)])
uploads = APIRouter()

UPLOAD_URL_TTL_S = 3600


def _sign(key: str, template_id: str, files_hash: str, expires: int) -> str:
    message = f"{template_id}:{files_hash}:{expires}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


@router.post("/v3/templates", status_code=202, response_model=TemplateRequestResponseV3)
async def request_build(body: TemplateBuildRequestV3, node: NodeDep,
                        caller: CallerDep) -> TemplateRequestResponseV3:
    existing = await node.template_store.get_template(body.name.partition(":")[0])
    if existing is not None and not node.tenancy.owns(caller, Owned.TEMPLATE,
                                                      existing.template_id):
        # Names are one namespace on a node: another team's (or the node's own) is taken.
        raise Conflict(f"template name '{existing.name}' is taken")
    asked = await build_op.request_build(node, body.name, body.tags or [],
                                         cpu_count=body.cpu_count, memory_mb=body.memory_mb)
    record = asked.template
    if existing is None and node.tenancy.owner(Owned.TEMPLATE, record.template_id) is None:
        await node.tenancy.claim(Owned.TEMPLATE, record.template_id, caller.team_id)
    return TemplateRequestResponseV3(
        templateID=record.template_id, buildID=asked.build.build_id, public=record.public,
        names=[record.name], tags=asked.tags, aliases=[record.name])


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201,
            response_model=TemplateBuildFileUpload, response_model_exclude_none=True)
async def file_upload_link(
    template_id: str, files_hash: str, request: Request, node: NodeDep
) -> TemplateBuildFileUpload:
    target = await files_op.upload_target(node, template_id, files_hash)
    if target.present:
        return TemplateBuildFileUpload(present=True)
    expires = int(time.time()) + UPLOAD_URL_TTL_S
    signature = _sign(request.app.state.api_key, target.template_id, files_hash, expires)
    url = str(request.url_for("upload_files", template_id=target.template_id,
                              files_hash=files_hash).include_query_params(
        expires=expires, signature=signature))
    return TemplateBuildFileUpload(present=False, url=url, headers={})


@uploads.put("/templates/{template_id}/files/{files_hash}/upload", name="upload_files")
async def upload_files(
    template_id: str, files_hash: str, request: Request, expires: int = 0, signature: str = ""
) -> Response:
    check_files_hash(files_hash)
    wanted = _sign(request.app.state.api_key, template_id, files_hash, expires)
    if not hmac.compare_digest(wanted, signature):
        raise PermissionDenied("invalid upload signature")
    if expires < time.time():
        raise PermissionDenied("the upload URL has expired")
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    await files_op.receive_files(node_of(request), files_hash, request.stream(),
                                 declared=declared)
    return Response(status_code=201)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(
    template_id: str, build_id: str, body: TemplateBuildStartV2, node: NodeDep,
    caller: CallerDep,
) -> Response:
    if body.from_template:
        await require_template(node, caller, body.from_template, manage=False)
    registry = body.from_image_registry
    source = build_op.BuildSource(
        from_image=body.from_image, from_template=body.from_template,
        registry=registry.model_dump() if registry else None,
        steps=[s.model_dump(by_alias=True) for s in body.steps],
        start_cmd=body.start_cmd, ready_cmd=body.ready_cmd, force=body.force,
        dockerfile=body.dockerfile, context_hash=body.context_hash,
        build_args=body.build_args, target=body.target,
        auth=(registry.username, registry.password or "")
        if registry and registry.username else None,
    )
    await build_op.start_build(node, template_id, build_id, source)
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status",
            response_model=TemplateBuildInfo, response_model_exclude_none=True)
async def build_status(
    template_id: str, build_id: str, node: NodeDep,
    logsOffset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=100)] = 100,
    level: str | None = None,
) -> TemplateBuildInfo:
    progress = await build_op.build_status(node, template_id, build_id, offset=logsOffset,
                                           limit=limit, level=level)
    build = progress.build
    reason = None
    if build.status == "error":
        reason = BuildStatusReason(message=build.reason or "the build failed",
                                   step=build.reason_step)
    return TemplateBuildInfo(
        templateID=progress.template.template_id, buildID=build_id, status=build.status,
        logs=[f"[{iso(e.at)}] {e.message}" for e in progress.entries],
        logEntries=[BuildLogEntry(timestamp=iso(e.at), level=e.level, message=e.message,
                                  step=e.step) for e in progress.entries],
        reason=reason)


@router.get("/templates/aliases/{alias}", response_model=TemplateAliasResponse)
async def alias(alias: str, node: NodeDep) -> TemplateAliasResponse:
    record = await catalog_op.find_alias(node, alias)
    return TemplateAliasResponse(templateID=record.template_id, public=record.public)


def template_out(summary: catalog_op.TemplateSummary, settings: Settings) -> TemplateOut:
    record, shown = summary.template, summary.shown
    return TemplateOut(
        templateID=record.template_id, buildID=shown.build_id if shown else "",
        cpuCount=record.cpu_count, memoryMB=record.memory_mb,
        diskSizeMB=settings.disk_size_mb, public=record.public, aliases=[record.name],
        names=[record.name], createdAt=iso(record.created_at),
        updatedAt=iso(record.updated_at),
        lastSpawnedAt=iso(record.last_spawned_at) if record.last_spawned_at else None,
        spawnCount=record.spawn_count, buildCount=summary.build_count,
        envdVersion=ENVD_VERSION, buildStatus=shown.status if shown else "waiting",
    )


@router.get("/templates", response_model=list[TemplateOut])
async def list_templates(node: NodeDep, caller: CallerDep) -> list[TemplateOut]:
    return [template_out(s, node.settings) for s in await catalog_op.list_templates(node)
            if sees_template(node.tenancy, caller, s.template)]


@router.get("/templates/{template_id}/tags", response_model=list[TemplateTagOut])
async def list_tags(template_id: str, node: NodeDep) -> list[TemplateTagOut]:
    return [TemplateTagOut(tag=t, buildID=b, createdAt=iso(at))
            for t, b, at in await catalog_op.list_tags(node, template_id)]


@router.post("/templates/tags", status_code=201, response_model=AssignedTags)
async def assign_tags(body: AssignTags, node: NodeDep, caller: CallerDep) -> AssignedTags:
    await require_template(node, caller, body.target, manage=True)
    build_id = await catalog_op.assign_tags(node, body.target, body.tags)
    return AssignedTags(buildID=build_id, tags=body.tags)


@router.delete("/templates/tags", status_code=204)
async def delete_tags(body: DeleteTags, node: NodeDep, caller: CallerDep) -> Response:
    await require_template(node, caller, body.name, manage=True)
    await catalog_op.delete_tags(node, body.name, body.tags)
    return Response(status_code=204)


@router.post("/sandboxes-cold", status_code=201, response_model=SandboxOut)
async def create_cold(body: ColdSandbox, node: NodeDep, caller: CallerDep) -> SandboxOut:
    """AgentENV's cold start: a sandbox straight from an OCI image (``ops/cold_start.py``)."""
    timeout = timeout_or_default(node.settings, body.timeout)
    check_sandbox_inputs(node.settings, body.metadata, body.env_vars)
    params = CreateParams(
        template=body.image, timeout_s=timeout, metadata=body.metadata or {},
        env_vars=body.env_vars or {},
        auto_pause=node.settings.auto_pause_default if body.auto_pause is None
        else body.auto_pause,
        allow_internet_access=body.allow_internet_access, network=body.network,
        team_id=node.tenancy.stamp(caller),
    )
    auth = None
    if body.registry is not None and body.registry.username:
        auth = (body.registry.username, body.registry.password or "")
    record = await cold_start(node, body.image, params, cpu_count=body.cpu_count,
                              memory_mb=body.memory_mb, start_cmd=body.start_cmd, auth=auth)
    return sandbox_out(record, node.settings)


@router.get("/images", dependencies=[Depends(require_operator)])
async def list_images(node: NodeDep) -> list[dict[str, object]]:
    """aenv's own view of the image cache: every pulled reference, how much of it is on disk
    now, and the last progress line of pulls under way (``pulling``)."""
    return [
        {"reference": i.reference, "progress": i.progress} if i.manifest_digest is None else {
            "reference": i.reference, "manifestDigest": i.manifest_digest,
            "layers": i.layers, "layersCached": i.layers_cached,
            "compressedBytes": i.compressed_bytes, "progress": i.progress,
        }
        for i in await images_op.cached_images(node)
    ]
