"""Team ownership at the API's door (``orchestrator/tenancy.py``; docs/teams.md).

:func:`guard_path` runs before every authenticated route: an object named in the path
(``sandbox_id``, ``template_id``, ``alias``, ``volume_id``) that is another team's answers
404, exactly as one that does not exist, so the other team learns nothing. The helpers check
what a body names (the template a sandbox is made from, the volumes it mounts, the target of
a tag) and filter what a listing shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from fastapi import Request

from aenv.api.auth import identify, tenancy_of
from aenv.core.errors import NotFound
from aenv.core.ids import is_volume_id
from aenv.orchestrator.context import Node
from aenv.orchestrator.paused_repo import paused_id
from aenv.orchestrator.tenancy import Caller, Owned, Tenancy
from aenv.orchestrator.volumes import name_ok as volume_name_ok


class TemplateLike(Protocol):
    @property
    def template_id(self) -> str: ...
    @property
    def public(self) -> bool: ...


async def guard_path(request: Request) -> None:
    caller = await identify(request)
    node: Node = request.app.state.node
    params = request.path_params
    read_only = request.method in ("GET", "HEAD")
    sandbox_id = params.get("sandbox_id")
    if sandbox_id is not None:
        await require_sandbox(node, caller, sandbox_id)
    template = params.get("template_id") or params.get("alias")
    if template is not None:
        await require_template(node, caller, template, manage=not read_only)
    volume_id = params.get("volume_id")
    if volume_id is not None:
        manifest = await node.volumes.catalog.get(volume_id) if is_volume_id(volume_id) else None
        if manifest is not None and not node.tenancy.is_team(caller, manifest.team_id):
            raise NotFound(f"volume {volume_id} not found")


async def require_sandbox(node: Node, caller: Caller, sandbox_id: str) -> None:
    record = await node.store.get(sandbox_id)
    team: str | None
    if record is not None:
        team = record.team_id
    else:
        # Paused on another node and published: its record is in the repository.
        published = await node.repository.lookup(paused_id(sandbox_id))
        if published is None:
            return  # unknown: the route answers its own 404
        written = (published.manifest.sandbox or {}).get("team_id")
        team = written if isinstance(written, str) else None
    if not node.tenancy.is_team(caller, team):
        raise NotFound(f"sandbox {sandbox_id} not found")


async def require_template(node: Node, caller: Caller, name: str, *, manage: bool) -> None:
    """``name`` (a template id or name, ``name:tag``, a snapshot id or name) is the caller's
    to use (``manage``: to change or delete); 404 otherwise. An unknown name passes: the
    route answers its own 404."""
    tenancy = node.tenancy
    base = name.partition(":")[0]
    record = await node.template_store.get_template(base)
    if record is not None:
        if not (tenancy.owns(caller, Owned.TEMPLATE, record.template_id)
                or (not manage and sees_template(tenancy, caller, record))):
            raise NotFound(f"template '{name}' not found")
        return
    # A snapshot (committed by any node sharing the repository: looked up, not only found in
    # this node's index), or a template another node built (its image names its team).
    # One answered here and still being committed is used at once, without its commit.
    pending = node.repository.pending_draft(base)
    if pending is not None and pending.kind == "snapshot":
        if not tenancy.is_team(caller, pending.team_id):
            raise NotFound(f"template '{name}' not found")
        return
    snapshot = await node.repository.lookup(base)
    if snapshot is not None and snapshot.manifest.kind == "snapshot":
        if not tenancy.is_team(caller, snapshot.manifest.team_id):
            raise NotFound(f"template '{name}' not found")
        return
    images = [s for s in node.repository.list(kind="template")
              if base in s.manifest.names or s.manifest.template_id == base]
    if images and not tenancy.image_visible(caller, images[0].manifest.team_id):
        raise NotFound(f"template '{name}' not found")


def sees_template(tenancy: Tenancy, caller: Caller, record: TemplateLike) -> bool:
    """Public, the node's own (unowned), or the caller's."""
    owner = tenancy.owner(Owned.TEMPLATE, record.template_id)
    return record.public or owner is None or owner == caller.team_id


async def require_volumes(node: Node, caller: Caller, names: Iterable[str]) -> None:
    """Every volume named is the caller's (volumes are asked for by name)."""
    for name in names:
        if not volume_name_ok(name):
            continue  # refused as malformed by the create itself (400)
        manifest = await node.volumes.catalog.by_name(name, node.tenancy.stamp(caller))
        if manifest is not None and not node.tenancy.is_team(caller, manifest.team_id):
            raise NotFound(f"volume '{name}' not found")


def caller_of(request: Request) -> Caller:
    caller: Caller = request.state.caller
    return caller


__all__ = ["caller_of", "guard_path", "require_sandbox", "require_template",
           "require_volumes", "sees_template", "tenancy_of"]
