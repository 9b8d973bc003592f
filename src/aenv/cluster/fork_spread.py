"""A fork whose source node is full: the children it cannot hold start on other nodes.

The source's node forks what fits (its answer lists the rest as 429 entries). For those,
the parent is snapshotted once on its node (the snapshot goes to the shared repository),
the scheduler spreads the remaining children over other nodes (``spread``), and each is
created there from the snapshot. The answer keeps the node's shape: one entry per child,
in order, each a sandbox or an error.

A child made elsewhere is what a child forked on the parent's node is
(``orchestrator/ops/fork.py``): the snapshot carries the parent's files, memory, metadata,
environment variables and size; the create (``child_body``) carries the rest of the parent's
record, read from its node: the lifetime policy (auto-pause, with or without memory,
auto-resume), the network (internet access, ``allowOut``/``denyOut``), and, aenv's own
``forkOf``, the parent's template (id and alias) and that the child continues the parent's
boot (its boot id) instead of starting a new one.

The snapshot stays in the repository, named ``fork-<parent id>-<n>``: a node's restore of
a memory image needs its blobs until the children are gone, and the repository's garbage
collection keeps what any manifest still names. It is listed with the other snapshots.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.responses import Response

from aenv.cluster.scheduler_client import SchedulerClient
from aenv.edge.errors import QUOTA_EXCEEDED, error_content

#: Sends (method, base URL, path, JSON body) with the caller's headers; the httpx answer.
Send = Callable[[str, str, str, object], Awaitable[httpx.Response]]


async def spread(send: Send, scheduler: SchedulerClient, *,
                 parent_id: str, parent_node: tuple[str, str], entries: list[dict[str, Any]],
                 timeout: int | None, key: str | None = None
                 ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """``entries`` (the node's answer) with its 429 entries replaced by children on other
    nodes where there is room; the (sandbox id, node id) of each child made here."""
    # A child refused for its team's quota would be refused on every node.
    full = [i for i, e in enumerate(entries)
            if (e.get("error") or {}).get("code") == 429
            and (e.get("error") or {}).get("error") != QUOTA_EXCEEDED]
    if not full:
        return entries, []
    node_id, address = parent_node
    name = f"fork-{parent_id}-{secrets.token_hex(3)}"
    try:
        parent = await send("GET", address, f"/sandboxes/{parent_id}", None)
        if parent.status_code != 200:
            return entries, []  # the node's own answer stands: its children, and its 429s
        snap = await send("POST", address, f"/sandboxes/{parent_id}/snapshots", {"name": name})
    except httpx.TransportError:
        return entries, []
    if snap.status_code != 201:
        return entries, []
    snapshot_id = snap.json()["snapshotID"]
    body = child_body(parent.json(), snapshot_id, timeout)
    placed = await scheduler.place(templateID=snapshot_id, snapshotID=snapshot_id,
                                   count=len(full), spread=True, exclude=[node_id], key=key)
    if isinstance(placed, Response):
        return entries, []  # the node's own answer stands: its children, and its 429s
    made: list[tuple[str, str]] = []
    slots = iter(full)
    for placement in placed:
        here: list[str] = []
        for _ in range(placement["count"]):
            index = next(slots)
            try:
                created = await send("POST", placement["address"], "/sandboxes", body)
            except httpx.TransportError as exc:
                entries[index] = {"error": error_content(
                    503, f"node {placement['nodeID']} cannot be reached: {type(exc).__name__}")}
                continue
            if created.status_code == 201:
                child = created.json()
                # In the node's own entries' shape: a fork's answer leaves out what is null.
                entries[index] = {"sandbox": {k: v for k, v in child.items() if v is not None}}
                made.append((str(child["sandboxID"]), placement["nodeID"]))
                here.append(str(child["sandboxID"]))
            else:
                entries[index] = {"error": _error_of(created)}
        await scheduler.settle(placement["reservationID"], commit=True, sandbox_ids=here)
    return entries, made


def child_body(parent: dict[str, Any], snapshot_id: str, timeout: int | None
               ) -> dict[str, Any]:
    """The create of one child from ``snapshot_id`` that makes it what a child forked on
    the parent's node is: ``parent`` is the parent's ``GET /sandboxes/{id}``; ``timeout``
    the fork's (None: the node's default, as on the parent's node)."""
    lifecycle = parent.get("lifecycle") or {}
    body: dict[str, Any] = {
        "templateID": snapshot_id,
        "autoPause": lifecycle.get("onTimeout") == "pause",
        "autoPauseMemory": lifecycle.get("autoPauseMemory") is not False,
        "autoResume": {"enabled": bool(lifecycle.get("autoResume"))},
        "allow_internet_access": parent.get("allowInternetAccess"),
        "network": parent.get("network"),
        "iam": parent.get("iam"),
        "forkOf": {"templateID": parent["templateID"], "alias": parent.get("alias")},
    }
    if timeout is not None:
        body["timeout"] = timeout
    return body


def _error_of(answer: httpx.Response) -> dict[str, object]:
    try:
        body = answer.json()
    except json.JSONDecodeError:
        body = {}
    return error_content(answer.status_code, str(body.get("message") if isinstance(body, dict)
                                                 else answer.text))
