"""The node's composition root: settings → parts → one frozen ``Node`` → started services.

Everything the node owns is entered into one ``AsyncExitStack`` as it is opened, so shutdown
undoes start-up in reverse, whatever step start-up reached: the supervisor first (every
background loop stops), then the services whose loops those were (in-flight spills finish,
ready pool sandboxes are destroyed, kills that answered early finish their teardown), then the
network pool, the guest connections and the store. Sandboxes stay running: the next start
re-attaches them.

Start-up order: envd bundle, repository, base template (with visible progress), store,
network pool, runtime (``runtime/registry.py``: ``Settings.runtime``), workspaces, images;
the ``Node``; then crash recovery, the background loops, the base template's memory image,
the warm and pre-created pools, the cluster heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aenv.cluster.peer_fetch import PeerBlobs
from aenv.compose import parts
from aenv.compose.cluster import (
    audit_store,
    join_cluster,
    join_peers,
    secret_store,
    team_directory,
    team_usage,
    webhook_defs,
)
from aenv.core.errors import AenvError
from aenv.core.net import EgressPolicy
from aenv.core.settings import Settings
from aenv.network.egress_tls import Interception
from aenv.network.guest_http import GuestConnector
from aenv.network.pool import NetConfig, SlotPool
from aenv.orchestrator.admission import Admission
from aenv.orchestrator.audit import AuditTrail
from aenv.orchestrator.builder import Builder
from aenv.orchestrator.catalog import TemplateCatalog
from aenv.orchestrator.context import Node
from aenv.orchestrator.deaths import DeathWatch
from aenv.orchestrator.fleet_gauges import run_gauges_loop
from aenv.orchestrator.gc import run_gc_loop
from aenv.orchestrator.idle import run_idle_loop
from aenv.orchestrator.liveness import run_liveness_loop
from aenv.orchestrator.node_identity import node_id
from aenv.orchestrator.ops.interpreter_template import run_provision_loop
from aenv.orchestrator.owners import Owners
from aenv.orchestrator.paused_repo import publish_pending
from aenv.orchestrator.pool_demand import Demand
from aenv.orchestrator.precreated import PrecreatedPool
from aenv.orchestrator.recover import recover
from aenv.orchestrator.restore_match import host_requirements
from aenv.orchestrator.resume_ready import ResumeReady
from aenv.orchestrator.sandbox_logs import LogBook
from aenv.orchestrator.secrets import Vault
from aenv.orchestrator.settle import settle
from aenv.orchestrator.spill import Spiller
from aenv.orchestrator.spill_events import SpillEvents
from aenv.orchestrator.supervisor import Supervisor
from aenv.orchestrator.task_guard import run_task_guard_loop
from aenv.orchestrator.team_metrics import TeamMeter
from aenv.orchestrator.team_quota import QuotaGate
from aenv.orchestrator.template_image import with_memory_image
from aenv.orchestrator.tenancy import Tenancy
from aenv.orchestrator.ttl import run_ttl_loop
from aenv.orchestrator.volumes import Volumes
from aenv.orchestrator.warm import WarmPool
from aenv.orchestrator.webhooks import Webhooks
from aenv.orchestrator.workload_identity import Issuer, TokenSpec
from aenv.runtime import reaper
from aenv.runtime.registry import build_runtime
from aenv.storage.layers import LayerStore
from aenv.storage.pending_commits import CLOSE_S as COMMITS_CLOSE_S
from aenv.storage.rootfs import RootfsStore
from aenv.storage.volume_catalog import VolumeCatalog
from aenv.storage.volume_images import VolumeImages
from aenv.store.sandbox_logs import SandboxLogStore
from aenv.store.sqlite import Store
from aenv.store.team_samples import TeamSampleStore
from aenv.store.templates import TemplateStore
from aenv.store.tenancy import TenancyStore
from aenv.store.webhooks import WebhookStore
from aenv.templates import code_interpreter

log = logging.getLogger("aenv.compose")

#: A close step this slow is logged with its time.
SLOW_CLOSE_S = 1.0
#: A close step still going after this long is cut short (logged): the node must stop.
CLOSE_STEP_S = 10.0


@contextlib.asynccontextmanager
async def running_node(settings: Settings) -> AsyncIterator[Node]:
    """The node, started; on exit everything it opened is closed (in reverse)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        assembled = await _assemble(settings, stack)
        await _start(assembled, stack)
        yield assembled.node


@dataclass(frozen=True)
class _Assembled:
    node: Node
    #: The node's parts as what they are (the node holds them as the orchestrator's view).
    pool: SlotPool
    catalog: TemplateCatalog


async def _assemble(settings: Settings, stack: contextlib.AsyncExitStack) -> _Assembled:
    """Open every part and build the frozen context (nothing runs in the background yet)."""
    bundle = await parts.prepare_envd(settings)
    layers = LayerStore(settings.layers_dir or settings.home / "layers")
    repository = parts.open_repository(settings, layers)
    with parts.console.status(f"opening the repository {repository.store.describe()}"):
        for leftover in await repository.start():
            log.info("removed %s, left by an interrupted snapshot", leftover)
    _closing(stack, "the repository's pending commits", repository.close,
             within_s=COMMITS_CLOSE_S + CLOSE_STEP_S)
    catalog = TemplateCatalog(layers, repository)
    catalog.own_bundle = bundle
    await parts.prepare_templates(catalog)
    store = await Store.open(settings.home / "state.db")
    _closing(stack, "the store", store.close)
    pool = SlotPool(NetConfig(
        low=min(max(1, settings.net_pool_size // 2), settings.net_pool_size),
        high=settings.net_pool_size,
        first_index=settings.net_first_index, last_index=settings.net_last_index,
        resolvers=settings.egress_resolvers,
    ))
    guests = GuestConnector()
    _closing(stack, "the guest connections", guests.aclose)
    runtime = build_runtime(settings)
    _closing(stack, "the runtime", runtime.aclose)
    catalog.host = await host_requirements(runtime)
    workspaces = (await parts.open_workspaces(settings)
                  if settings.workspace == "disk" else None)
    if workspaces is not None:
        catalog.disk_dir = workspaces.pool.path / "snapshots"
    repository.start_exports()  # their disk clones are on the pool, mounted now
    rootfs = RootfsStore(settings.home / "sandboxes", workspaces, disk_mb=settings.disk_size_mb)
    template_store = TemplateStore(store.db)
    catalog.built = template_store
    build_dir = settings.home / "build"
    await parts.sweep_build_scratch(build_dir)
    images = parts.image_store(settings, layers, rootfs)
    # What a killed unpack, build step or pull left (never visible: layers and blobs appear
    # by rename, but on disk). A live writer of a shared layers dir holds its flock: skipped.
    leftovers = await layers.clean_staging() + await images.skopeo.clean_tmp()
    if leftovers:
        log.info("removed %d leftovers of interrupted unpacks, build steps and pulls",
                 leftovers)
    tenancy = Tenancy(team_directory(settings, store), TenancyStore(store.db))
    vault = Vault(secret_store(settings, store, stack), parts.api_key_for(settings))
    node = Node(
        settings=settings, store=store, runtime=runtime, pool=pool, rootfs=rootfs,
        templates=catalog, guests=guests, envd_bundle=bundle, repository=repository,
        paused_dir=settings.home / "paused", layers=layers, images=images,
        template_store=template_store, build_dir=build_dir,
        builder=Builder(template_store, files_dir=build_dir / "files",
                        scratch_dir=build_dir / "scratch"),
        warm=WarmPool(settings.warm_pool_size, settings.warm_pool_low),
        precreated=PrecreatedPool(settings.precreate_pool_size, Demand(
            floor=settings.precreate_pool_size, ceiling=settings.precreate_pool_max,
            window_s=settings.precreate_demand_window_s)),
        resume_ready=ResumeReady(settings.resume_ready_size, settings.resume_ready_s),
        spiller=Spiller(settings),
        host_requirements=catalog.host, workspaces=workspaces,
        volumes=Volumes(settings, VolumeCatalog(repository.store), VolumeImages(settings.home),
                        node_id(settings)),
        audit=AuditTrail(audit_store(settings, store, stack), settings.audit_max_entries),
        tenancy=tenancy,
        secrets=vault,
        webhooks=Webhooks(webhook_defs(settings, store, stack), WebhookStore(store.db), vault,
                          lambda: tenancy.default_team_id,
                          allow_private=settings.webhook_allow_private,
                          retry_max_s=settings.webhook_retry_max_s,
                          give_up_s=settings.webhook_give_up_s),
        identity=Issuer(parts.api_key_for(settings), _issuer_url(settings),
                        settings.identity_trust_domain),
        team_meter=TeamMeter(store, TeamSampleStore(store.db),
                             lambda: tenancy.default_team_id,
                             keep_s=settings.team_metrics_keep_s),
        logbook=LogBook(store, SandboxLogStore(store.db), runtime.console_log,
                        max_entries=settings.sandbox_log_max_entries,
                        keep_s=settings.sandbox_log_keep_s),
        supervisor=Supervisor(),
        admission=Admission(max_starts=settings.max_concurrent_starts,
                            max_waiting=settings.max_queued_starts,
                            retry_after_s=settings.busy_retry_after_s),
        owners=Owners(deadline_s=settings.operation_deadline_s,
                      wait_s=settings.transition_wait_s),
        quotas=QuotaGate(shared=team_usage(settings, stack)),
    )
    node.owners.settler = partial(settle, node)
    if settings.observe:
        store.on_event = partial(_lifecycle_event, node, SpillEvents())
    node.builder.attach(node)
    return _Assembled(node, pool, catalog)


def _lifecycle_event(node: Node, spills: SpillEvents, sandbox_id: str, team_id: str | None,
                     kind: str, detail: Any, record: Any = None) -> None:
    """Every lifecycle event of the store, to the sandbox's log and its team's webhooks (a
    spill's return to ``paused`` told from a pause)."""
    kind = spills.kind(sandbox_id, kind, detail)
    node.logbook.on_event(sandbox_id, team_id, kind, detail, record)
    node.webhooks.on_event(sandbox_id, team_id, kind, detail, record)


async def _start(assembled: _Assembled, stack: contextlib.AsyncExitStack) -> None:
    """Recover, then start every service; each is closed by ``stack`` after the supervisor
    (entered last, so closed first) has stopped their loops."""
    node, pool, catalog = assembled.node, assembled.pool, assembled.catalog
    settings = node.settings
    _closing(stack, "the network pool", pool.close)
    await pool.start()
    _closing(stack, "the pre-created pool", node.precreated.close)
    _closing(stack, "the warm pool", node.warm.close)
    _closing(stack, "the sandboxes' owners", node.owners.close)
    # Closed before the owners: giving a ready sandbox up takes the sandbox's turn.
    _closing(stack, "the ready-to-resume sandboxes", node.resume_ready.close)
    _closing(stack, "the spiller", node.spiller.close)
    _closing(stack, "the template builder", node.builder.close)
    deaths = DeathWatch(node)
    _closing(stack, "the death watch", deaths.close)
    # Closed now (if start-up fails below) and again, first, at shutdown (see the end).
    _closing(stack, "the supervisor", node.supervisor.close)
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
    node.volumes.images.clean_staging()
    await node.volumes.recover(node.store)
    _closing(stack, "the volumes", node.volumes.release_all)
    _closing(stack, "the audit trail", node.audit.flush)
    _closing(stack, "the sandbox logs", node.logbook.flush)
    _closing(stack, "the team directory", node.tenancy.directory.close)
    # Templates built before teams become the first team's (the built-in one stays public).
    await node.tenancy.start(parts.api_key_for(settings), adopt_templates=[
        t.template_id for t in await node.template_store.list_templates()
        if t.name != code_interpreter.NAME])
    _closing(stack, "the keys' last use", node.tenancy.flush_last_used)
    pool.proxy.reveal = partial(_reveal, node)
    pool.proxy.mint = partial(_mint, node)
    pool.proxy.interception = await asyncio.to_thread(
        _interception, settings, parts.api_key_for(settings))
    if published := await publish_pending(node):
        log.info("published %d paused sandboxes to the repository", published)
    if failed := await node.builder.recover():
        log.info("%d template builds were cut short by the restart", failed)
    await node.resume_ready.start(node)
    await node.spiller.start(node)
    loops: dict[str, Callable[[], Awaitable[None]]] = {
        "ttl": partial(run_ttl_loop, node), "idle": partial(run_idle_loop, node),
        "liveness": partial(run_liveness_loop, node), "reaper": reaper.sweep,
        "task-guard": partial(run_task_guard_loop, node),
        "volume-release": node.volumes.run_release_loop,
        "audit": node.audit.run_flush_loop,
        "key-use": node.tenancy.run_flush_loop,
        "team-directory": node.tenancy.run_repair_loop,
    }
    if settings.observe:
        loops.update({"sandbox-logs": node.logbook.run, "team-metrics": node.team_meter.run,
                      "webhooks": node.webhooks.run,
                      "gauges": partial(run_gauges_loop, node)})
    if settings.gc_interval_s:
        loops["gc"] = partial(run_gc_loop, node)
    if node.workspaces is not None:
        loops["pool-trim"] = node.workspaces.trimmer.run
    for name, loop in loops.items():
        node.supervisor.spawn(name, loop)
    deaths.start()
    base = await catalog.resolve(settings.default_template)
    with parts.console.status("preparing the base template's memory image"):
        base = await with_memory_image(node, base)
    catalog.use_image(base)
    await node.warm.start(node, base)
    await node.precreated.start(node, base)
    if settings.code_interpreter:
        # After the base template's image: the build starts from it, and a node's start-up
        # (its warm pool's restores) does not share the CPUs with a pip install.
        node.supervisor.spawn("code-interpreter", partial(run_provision_loop, node))
    if settings.cluster:
        heartbeat = join_cluster(node, settings.cluster)
        _closing(stack, "the cluster heartbeat", heartbeat.close)
        heartbeat.start()
        if settings.peer_fetch:
            peers = join_peers(settings, heartbeat)
            node.repository.cache.peers = peers
            _closing(stack, "the peers' blob fetches", partial(_leave_peers, node, peers))
    # Entered last, closed first: every background loop stops before what it used closes.
    _closing(stack, "the supervisor", node.supervisor.close)
    # Closed before it: kills that answered early finish their release while every
    # service it uses is still up.
    _closing(stack, "the kills in flight", node.owners.finish_kills)


def _interception(settings: Settings, operator_key: str) -> Interception:
    """The egress CA (the operator key's: one per cluster) and its leaves' directory."""
    made = Interception(operator_key.encode(), settings.home / "egress-tls",
                        upstream_cafile=settings.egress_upstream_ca_file)
    made.prepare()
    return made


def _issuer_url(settings: Settings) -> str:
    return settings.identity_issuer or settings.advertise or f"http://{settings.listen}"


async def _mint(node: Node, policy: EgressPolicy, name: str) -> str | None:
    """A workload identity token the policy's sandbox registered (None: it did not)."""
    for token, audience, token_type in policy.identity:
        if token == name and policy.sandbox_id is not None:
            return node.identity.mint(policy.sandbox_id, policy.team_id,
                                      TokenSpec(token, audience, token_type))
    return None


async def _reveal(node: Node, team_id: str | None, name: str) -> str | None:
    """A secret for the egress proxy's rules (None: the default team's, as records say)."""
    return await node.secrets.reveal(team_id or node.tenancy.default_team_id, name)


def _closing(stack: contextlib.AsyncExitStack, what: str,
             close: Callable[[], Awaitable[object]], within_s: float = CLOSE_STEP_S) -> None:
    """Close ``what`` when the stack unwinds; a failure there is logged, and the rest of
    the shutdown goes on."""
    async def closed() -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(within_s):
                await close()
        except TimeoutError:
            # What it left undone (a sandbox of a pool, a flush) the next start recovers; a
            # shutdown that hangs instead gets the node killed with everything still open.
            log.warning("closing %s did not end within %g s: cut short", what, within_s)
        except Exception:
            log.exception("closing %s failed", what)
        # A shutdown that overstays its welcome is killed: which step held it is said here.
        if (took := time.monotonic() - started) >= SLOW_CLOSE_S:
            log.info("closing %s took %.1f s", what, took)

    stack.push_async_callback(closed)


async def _leave_peers(node: Node, peers: PeerBlobs) -> None:
    node.repository.cache.peers = None
    await peers.close()
