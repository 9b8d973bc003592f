"""Joining a cluster: the node's heartbeat to Redis, peer fetch of blobs from other nodes,
and where the state every node shares lives (teams and keys, secrets, webhooks, the audit
log, the teams' usage): the node's own database alone, or the cluster's Redis."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from aenv.cluster.heartbeat import Heartbeat
from aenv.cluster.peer_fetch import PeerBlobs
from aenv.compose.parts import api_key_for
from aenv.core.settings import Settings
from aenv.orchestrator.audit import AuditRows
from aenv.orchestrator.context import Node
from aenv.orchestrator.node_identity import node_id
from aenv.orchestrator.secrets import SecretRows
from aenv.orchestrator.team_directory import LocalDirectory, TeamDirectory
from aenv.orchestrator.team_quota import SharedUsage
from aenv.orchestrator.webhooks import WebhookDefs
from aenv.store.audit import AuditStore
from aenv.store.secrets import SecretStore
from aenv.store.sqlite import Store
from aenv.store.tenancy import TenancyStore
from aenv.store.webhooks import WebhookStore

log = logging.getLogger("aenv.compose")


def join_cluster(node: Node, url: str) -> Heartbeat:
    """The node's heartbeat to the cluster at Redis ``url`` (not started)."""
    from aenv.cluster.redis_client import connect

    heartbeat = Heartbeat(node, connect(url))
    log.info("joining the cluster at %s as node %s (%s)", _redacted(url), heartbeat.node_id,
             heartbeat.address)
    return heartbeat


def team_directory(settings: Settings, store: Store) -> TeamDirectory:
    """Where the node's teams and keys live: its own database, or in cluster mode the
    cluster's Redis (every node and gateway then sees one directory)."""
    if not settings.cluster:
        return LocalDirectory(TenancyStore(store.db))
    from aenv.cluster.redis_client import connect
    from aenv.cluster.team_directory import RedisDirectory

    return RedisDirectory(connect(settings.cluster))


def secret_store(settings: Settings, store: Store,
                 stack: contextlib.AsyncExitStack) -> SecretRows:
    """Where the node's secrets live: its own database, or in cluster mode the cluster's
    Redis (a secret set through any node is every node's; closed by ``stack``)."""
    if not settings.cluster:
        return SecretStore(store.db)
    from aenv.cluster.redis_client import connect
    from aenv.cluster.secret_store import RedisSecretStore

    shared = RedisSecretStore(connect(settings.cluster))
    stack.push_async_callback(_quietly, "the cluster's secrets", shared.close)
    return shared


def webhook_defs(settings: Settings, store: Store,
                 stack: contextlib.AsyncExitStack) -> WebhookDefs:
    """Where the teams' webhooks live: the node's own database, or in cluster mode the
    cluster's Redis (each node then delivers its own sandboxes' events to every webhook;
    closed by ``stack``)."""
    if not settings.cluster:
        return WebhookStore(store.db)
    from aenv.cluster.redis_client import connect
    from aenv.cluster.webhook_store import RedisWebhookStore

    shared = RedisWebhookStore(connect(settings.cluster))
    stack.push_async_callback(_quietly, "the cluster's webhooks", shared.close)
    return shared


def audit_store(settings: Settings, store: Store,
                stack: contextlib.AsyncExitStack) -> AuditRows:
    """Where the node's audit log is written: its own database, or in cluster mode the
    cluster's Redis stream, one log of every node (kept to about ``audit_max_entries``;
    closed by ``stack``, after the trail's last flush)."""
    if not settings.cluster:
        return AuditStore(store.db)
    from aenv.cluster.audit_store import RedisAuditStore
    from aenv.cluster.redis_client import connect

    shared = RedisAuditStore(connect(settings.cluster), settings.audit_max_entries)
    stack.push_async_callback(_quietly, "the cluster's audit log", shared.close)
    return shared


def team_usage(settings: Settings, stack: contextlib.AsyncExitStack) -> SharedUsage | None:
    """The cluster's ledger of the teams' usage, which the teams' quotas are held against
    cluster-wide (closed by ``stack``); None: a node alone holds them for itself."""
    if not settings.cluster:
        return None
    from aenv.cluster.keys import Keys
    from aenv.cluster.redis_client import connect
    from aenv.cluster.team_usage import ClusterTeamUsage

    redis = connect(settings.cluster)
    stack.push_async_callback(_quietly, "the cluster's team usage", redis.aclose)
    return ClusterTeamUsage(redis, Keys(), node_id(settings))


async def _quietly(what: str, close: Callable[[], Awaitable[object]]) -> None:
    """A shutdown step whose failure is logged: the rest of the shutdown goes on."""
    try:
        await close()
    except Exception:
        log.exception("closing %s failed", what)


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
