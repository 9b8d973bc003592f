"""Which CAs a sandbox's clients trust besides its image's: the platform's egress CA when its
``network.rules`` set headers, since the node then ends the TLS to those hosts with it
(network/egress_tls.py). Handed to envd at ``/init`` (create, fork, a reboot on its files)
and when ``PUT /network`` gives a running sandbox rules (envd/trust_store.py).

A memory image keeps what its sandbox trusted, and the CA is the operator key's, so a
sandbox paused, resumed, forked or moved to another node of the cluster needs nothing more.
"""

from __future__ import annotations

from typing import Any

from aenv.orchestrator.context import Node


def certificates(node: Node, network: dict[str, Any] | None) -> list[str]:
    ca = node.pool.egress_ca()
    if ca is None or not (network or {}).get("rules"):
        return []
    return [ca]
