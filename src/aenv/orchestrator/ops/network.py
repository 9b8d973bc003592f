"""Change a running sandbox's egress (``PUT /sandboxes/{id}/network``): replaces the whole
config; applies from the next packet on, open connections included.

Prerequisites: the sandbox is running. On success: the record and the slot's rules agree.
On failure: ``NotFound``; ``Conflict`` when not running; ``InvalidArgument`` for bad entries
(the old rules stay).
"""

from __future__ import annotations

from typing import Any

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator import egress_trust, traffic
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import identity_of, policy_from
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.instance_codec import decode


async def update_network(
    node: Node, sandbox_id: str, allow_internet_access: bool | None, network: dict[str, Any]
) -> None:
    held = await node.store.require(sandbox_id)
    policy = policy_from(allow_internet_access, network, held.team_id,
                         identity=identity_of(held), sandbox_id=sandbox_id)

    async def owned() -> None:
        record = await node.store.require(sandbox_id)
        if record.state != SandboxState.RUNNING:
            raise Conflict(f"sandbox {sandbox_id} is {record.state.public}")
        slot, _ = decode(record.instance, sandbox_id)
        if slot is None:
            raise Conflict(f"sandbox {sandbox_id} has no network to update")
        if trusted := egress_trust.certificates(node, network):
            # Before the rules apply: the first intercepted connection must find the CA.
            async with EnvdClient(node.guests.transport(slot), slot) as envd:
                await envd.trust(record.envd_token, trusted)
        await node.pool.set_egress(slot, policy)
        record = await node.store.update(
            record, allow_internet_access=allow_internet_access,
            network=traffic.keep_inbound(record.network, network))
        # Its configuration changed: an event for its logs and webhooks.
        await node.store.add_event(sandbox_id, "updated", {"what": "network"},
                                   team_id=record.team_id, record=record)

    await node.owners.run(sandbox_id, "network", owned)
