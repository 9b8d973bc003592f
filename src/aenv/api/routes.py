"""E2B control-plane routes, v1 and v2 (e2b-compat §2.3-2.4). Status codes are exact: the
generated SDK clients parse a body only for the documented success code."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse

from aenv.api import idempotency, listing
from aenv.api.auth import CallerDep, require_operator
from aenv.api.convert import detail, iso, listed, metric_out, sandbox_out
from aenv.api.node import NodeDep, node_of
from aenv.api.ownership import guard_path, require_template, require_volumes
from aenv.api.schemas import (
    ConnectBody,
    DrainOut,
    ErrorOut,
    ForkBody,
    ForkEntry,
    GcOut,
    LifecycleNow,
    ListedSandbox,
    NetworkUpdate,
    NewSandbox,
    PauseBody,
    RefreshBody,
    ResumeBody,
    SandboxDetail,
    SandboxMetric,
    SandboxOut,
    SnapshotBody,
    SnapshotInfo,
    TimeoutBody,
)
from aenv.api.snapshots import snapshot_info, snapshot_page
from aenv.core.errors import Conflict, InvalidArgument, NotFound, QuotaExceeded
from aenv.core.ids import is_sandbox_id
from aenv.core.states import SandboxState
from aenv.core.timeouts import check_timeout, timeout_or_default
from aenv.edge.errors import QUOTA_EXCEEDED
from aenv.edge.limits import check_sandbox_inputs
from aenv.orchestrator import gc, idle
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops import create as create_op
from aenv.orchestrator.ops import drain as drain_op
from aenv.orchestrator.ops import fork as fork_op
from aenv.orchestrator.ops import kill as kill_op
from aenv.orchestrator.ops import lifetime, metrics
from aenv.orchestrator.ops import network as network_op
from aenv.orchestrator.ops import pause as pause_op
from aenv.orchestrator.ops import resume as resume_op
from aenv.orchestrator.ops import snapshot as snapshot_op
from aenv.orchestrator.ops import template_catalog as catalog_op
from aenv.orchestrator.tenancy import Caller, Owned
from aenv.orchestrator.volumes import MountRequest
from aenv.orchestrator.workload_identity import parse_iam


def _touch(request: Request) -> None:
    # Every call naming a sandbox is traffic to it (the idle auto-pause, orchestrator/idle.py).
    sandbox_id = request.path_params.get("sandbox_id")
    if sandbox_id is not None:
        node_of(request).activity.touch(sandbox_id)


# ``guard_path`` first: a call on another team's sandbox is refused before anything of it.
router = APIRouter(dependencies=[Depends(guard_path), Depends(_touch)])
public = APIRouter()
#: The node's own routes: the operator key only.
_OPERATOR = [Depends(require_operator)]




def _checked_id(sandbox_id: str) -> str:
    # Anything that is not one of our ids cannot exist: 404, as for an unknown id.
    if not is_sandbox_id(sandbox_id):
        raise NotFound(f"sandbox {sandbox_id} not found")
    return sandbox_id


@public.get("/health")
async def health() -> PlainTextResponse:
    return PlainTextResponse("Health check successful")


async def _create(node: Node, body: NewSandbox, caller: Caller) -> SandboxOut:
    await require_template(node, caller, body.template_id, manage=False)
    if body.fork_of is not None:
        await require_template(node, caller, body.fork_of.template_id, manage=False)
    await require_volumes(node, caller, (m.name for m in body.volume_mounts or ()))
    timeout = timeout_or_default(node.settings, body.timeout)
    idle.check_metadata(body.metadata)
    check_sandbox_inputs(node.settings, body.metadata, body.env_vars)
    params = create_op.CreateParams(
        template=body.template_id,
        timeout_s=timeout,
        metadata=body.metadata or {},
        env_vars=body.env_vars or {},
        auto_pause=node.settings.auto_pause_default if body.auto_pause is None
        else body.auto_pause,
        auto_pause_memory=body.auto_pause_memory is not False,
        auto_resume=bool(body.auto_resume and body.auto_resume.enabled),
        allow_internet_access=body.allow_internet_access,
        network=body.network,
        identity_tokens=parse_iam(body.iam),
        fork_of=(body.fork_of.template_id, body.fork_of.alias) if body.fork_of else None,
        fresh_boot_id=body.fork_of is None,
        volume_mounts=tuple(MountRequest(m.name, m.path, m.read_only)
                            for m in body.volume_mounts or ()),
        team_id=node.tenancy.stamp(caller),
    )
    record = await create_op.create(node, params)
    return sandbox_out(record, node.settings)


@router.post("/v2/sandboxes", status_code=201, response_model=SandboxOut)
async def create_v2(body: NewSandbox, node: NodeDep, request: Request,
                    caller: CallerDep) -> SandboxOut:
    # A repeat with the same Idempotency-Key gets the first create's sandbox (idempotency.py).
    return await idempotency.once(request, body, lambda: _create(node, body, caller))


@router.post("/sandboxes", status_code=201, response_model=SandboxOut)
async def create_v1(body: NewSandbox, node: NodeDep, request: Request,
                    caller: CallerDep) -> SandboxOut:
    return await idempotency.once(request, body, lambda: _create(node, body, caller))


@router.get("/v2/sandboxes", response_model=list[ListedSandbox])
async def list_v2(
    node: NodeDep,
    caller: CallerDep,
    response: Response,
    metadata: str | None = None,
    state: Annotated[list[str] | None, Query()] = None,
    order: str | None = None,
    startedAfter: str | None = None,
    template: str | None = None,
    nextToken: str | None = None,
    limit: int | None = None,
) -> list[ListedSandbox]:
    if order not in (None, "", "asc", "desc"):
        raise InvalidArgument("order must be asc or desc")
    query = listing.ListQuery(
        states=listing.parse_states(state),
        metadata=listing.parse_metadata(metadata),
        ascending=order == "asc",
        started_after=listing.parse_started_after(startedAfter),
        template=template or None,
        cursor=listing.decode_cursor(nextToken),
        limit=listing.parse_limit(limit),
    )
    records = [r for r in await node.store.list(_VISIBLE)
               if node.tenancy.is_team(caller, r.team_id)]
    page, cursor = listing.apply(records, query)
    if cursor:
        response.headers["X-Next-Token"] = cursor
    response.headers["X-Total-Running"] = str(
        sum(1 for r in records if r.state.public == "running")
    )
    return [listed(r) for r in page]


_VISIBLE = [SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.PAUSING,
            SandboxState.RESUMING, SandboxState.SNAPSHOTTING, SandboxState.FORKING]


@router.get("/sandboxes", response_model=list[ListedSandbox])
async def list_v1(node: NodeDep, caller: CallerDep,
                  metadata: str | None = None) -> list[ListedSandbox]:
    wanted = listing.parse_metadata(metadata)
    records = await node.store.list([SandboxState.RUNNING])
    return [
        listed(r) for r in records
        if node.tenancy.is_team(caller, r.team_id)
        and all(r.metadata.get(k) == v for k, v in wanted.items())
    ]


# The SDK parses `network: null` as a config object and crashes: omit what is unset.
@router.get("/sandboxes/{sandbox_id}", response_model=SandboxDetail,
            response_model_exclude_none=True)
async def get_sandbox(sandbox_id: str, node: NodeDep) -> SandboxDetail:
    record = await node.store.require(_checked_id(sandbox_id))
    if record.state in (SandboxState.CREATING, SandboxState.KILLING):
        why = f": {record.last_error}" if record.last_error else ""  # e.g. it died
        raise NotFound(f"sandbox {sandbox_id} not found{why}")
    out = detail(record, node.settings, node.liveness.verdict(record.sandbox_id))
    held = node.owners.operation(record.sandbox_id)
    out.aenv = LifecycleNow(
        state=str(record.state), operation=held[0] if held else None,
        operationSince=iso(held[1]) if held else None,
        lastError=node.owners.last_error(record.sandbox_id) or record.last_error)
    return out


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill_sandbox(sandbox_id: str, node: NodeDep) -> Response:
    if not await kill_op.kill(node, sandbox_id := _checked_id(sandbox_id)):
        # Its kill began before (a teardown a restart or a failure left): gone already.
        raise NotFound(f"sandbox {sandbox_id} not found")
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: TimeoutBody, node: NodeDep) -> Response:
    await lifetime.set_timeout(node, _checked_id(sandbox_id), body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(sandbox_id: str, node: NodeDep, body: RefreshBody | None = None) -> Response:
    seconds = node.settings.default_timeout_s
    if body is not None and body.duration is not None:
        seconds = body.duration
    await lifetime.set_timeout(node, _checked_id(sandbox_id), seconds, allow_shorter=False)
    return Response(status_code=204)


async def _connect(node: Node, sandbox_id: str, timeout: int | None) -> JSONResponse:
    if timeout is not None:
        check_timeout(node.settings, timeout)
    record, resumed = await resume_op.resume(node, _checked_id(sandbox_id), timeout)
    body = sandbox_out(record, node.settings).model_dump()
    return JSONResponse(body, status_code=201 if resumed else 200)


@router.post("/v2/sandboxes/{sandbox_id}/connect", response_model=SandboxOut)
async def connect_v2(
    sandbox_id: str, node: NodeDep, body: ConnectBody | None = None
) -> JSONResponse:
    return await _connect(node, sandbox_id, body.timeout if body else None)


@router.post("/sandboxes/{sandbox_id}/connect", response_model=SandboxOut)
async def connect_v1(sandbox_id: str, body: TimeoutBody, node: NodeDep) -> JSONResponse:
    return await _connect(node, sandbox_id, body.timeout)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201, response_model=SandboxOut)
async def resume_v1(
    sandbox_id: str, node: NodeDep, body: ResumeBody | None = None
) -> JSONResponse:
    record = await node.store.require(_checked_id(sandbox_id))
    if record.state == SandboxState.RUNNING:
        raise Conflict(f"sandbox {sandbox_id} is already running")
    return await _connect(node, sandbox_id, body.timeout if body else None)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause_sandbox(
    sandbox_id: str, node: NodeDep, body: PauseBody | None = None
) -> Response:
    # ``memory: false`` keeps only the files on a node with disk workspaces; with the files in
    # sandbox memory (workspace=memory) keeping both is the only way to keep them.
    await pause_op.pause(node, _checked_id(sandbox_id),
                         require_healthy=bool(body and body.require_healthy_guest),
                         memory=not (body and body.memory is False))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, response_model=SnapshotInfo)
async def create_snapshot(
    sandbox_id: str, node: NodeDep, body: SnapshotBody | None = None
) -> SnapshotInfo:
    snapshot = await snapshot_op.create_snapshot(
        node, _checked_id(sandbox_id), body.name if body else None
    )
    return snapshot_info(snapshot)


@router.get("/snapshots", response_model=list[SnapshotInfo])
async def list_snapshots(
    node: NodeDep,
    caller: CallerDep,
    response: Response,
    sandboxID: str | None = None,
    name: str | None = None,
    limit: int | None = None,
    nextToken: str | None = None,
) -> list[SnapshotInfo]:
    await node.repository.settle()  # snapshots answered and still being committed
    await node.repository.refresh()
    found = [s for s in node.repository.list(sandbox_id=sandboxID or None, name=name or None)
             if node.tenancy.is_team(caller, s.manifest.team_id)]
    page, cursor = snapshot_page([s.manifest for s in found], limit=listing.parse_limit(limit),
                                 token=nextToken)
    if cursor:
        response.headers["X-Next-Token"] = cursor
    return [snapshot_info(s) for s in page]


@router.post("/repository/gc", response_model=GcOut, dependencies=_OPERATOR)
async def repository_gc(node: NodeDep) -> GcOut:
    """aenv's own: collect the repository's garbage now (``orchestrator/gc.py``)."""
    plan = await gc.collect(node)
    return GcOut(deletedBlobs=len(plan.delete), freedBytes=plan.freed_bytes,
                 keptReferenced=plan.kept_referenced, keptRecent=plan.kept_young)


@router.delete("/templates/{template_id:path}", status_code=204)
async def delete_template(template_id: str, node: NodeDep) -> Response:
    """A built template or a committed snapshot (``ops/template_catalog.py``)."""
    built = await node.template_store.get_template(template_id)
    await catalog_op.delete_template(node, template_id)
    if built is not None:
        await node.tenancy.release(Owned.TEMPLATE, built.template_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201, response_model=list[ForkEntry],
             response_model_exclude_none=True)
async def fork_sandbox(
    sandbox_id: str, node: NodeDep, body: ForkBody | None = None
) -> list[ForkEntry]:
    body = body or ForkBody()
    # A missing source fails the whole call (404); per-child errors are for children only.
    results = await fork_op.fork(node, _checked_id(sandbox_id), body.count, body.timeout)
    return [
        ForkEntry(sandbox=sandbox_out(r.sandbox, node.settings)) if r.sandbox is not None
        else ForkEntry(error=ErrorOut(
            code=r.error.http_status if r.error else 500,
            message=r.error.message if r.error else "unknown",
            error=QUOTA_EXCEEDED if isinstance(r.error, QuotaExceeded) else None))
        for r in results
    ]


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(sandbox_id: str, body: NetworkUpdate, node: NodeDep) -> Response:
    config = body.model_dump(by_alias=True, exclude_none=True, exclude={"allow_internet_access"})
    await network_op.update_network(
        node, _checked_id(sandbox_id), body.allow_internet_access, config
    )
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/metrics", response_model=list[SandboxMetric])
async def sandbox_metrics(
    sandbox_id: str, node: NodeDep, start: int | None = None, end: int | None = None
) -> list[SandboxMetric]:
    sample = await metrics.sample(node, _checked_id(sandbox_id))
    if sample is None:
        return []
    now = int(sample.timestamp)
    if (start is not None and now < start - 10) or (end is not None and now > end + 10):
        return []
    return [metric_out(sample)]


@router.api_route("/node/blobs/{digest}", methods=["GET", "HEAD"], response_model=None,
                  dependencies=_OPERATOR)
async def node_blob(digest: str, node: NodeDep) -> Response:
    """aenv's own, for peer fetch (``cluster/peer_fetch.py``): a repository blob from this
    node's cache; 404 if it has none (the asking node then goes to the repository)."""
    path = node.repository.cache.path(digest)  # InvalidArgument (400) for a bad digest
    if not await asyncio.to_thread(path.is_file):
        raise NotFound(f"blob {digest} is not cached on this node")
    return FileResponse(path, media_type="application/octet-stream")


@router.post("/node/drain", response_model=DrainOut, dependencies=_OPERATOR)
async def drain_node(node: NodeDep) -> DrainOut:
    """aenv's own: stop taking placements and hand every sandbox to the shared repository
    (``orchestrator/ops/drain.py``); the cluster resumes them elsewhere."""
    done = await drain_op.drain(node)
    return DrainOut(moved=done.moved, parked=done.parked, failed=done.failed)
