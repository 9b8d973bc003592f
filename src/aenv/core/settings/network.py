"""The node's network-slot range, egress resolution, and workload identity."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from aenv.core.settings.section import Section


class NetworkSettings(Section):
    """Network: the node's slot range, egress resolution, and workload identity."""

    net_first_index: int = Field(default=1, ge=1, le=65_000)
    """First network slot index this node may use (slots are named ``aenv-<index>``; give
    nodes sharing a machine disjoint ranges)."""

    net_last_index: int = Field(default=30_000, ge=1, le=65_000)
    """Last network slot index this node may use."""

    egress_resolvers: tuple[str, ...] = ()
    """DNS servers the node's egress proxy resolves the names of sandboxes with domain rules
    with (``network.allowOut`` / ``denyOut`` naming domains; docs/security.md). Empty: the
    host's ``/etc/resolv.conf``."""

    identity_issuer: str | None = None
    """The issuer URL of the workload identity tokens sandboxes' egress rules carry (E2B
    ``iam``; docs/teams.md): where verifiers find ``/.well-known/openid-configuration`` and
    the keys, so the public origin of the API (a cluster's gateway). Unset: ``advertise``,
    else ``http://`` + ``listen``."""

    identity_trust_domain: str = "aenv.local"
    """The SPIFFE trust domain in the tokens' subjects (``spiffe://<domain>/team/…``)."""

    egress_upstream_ca_file: Path | None = None
    """PEM CAs the node trusts, besides the host's own, for the hosts whose HTTPS it ends to
    put in a sandbox's ``network.rules`` headers (a private API's CA; docs/security.md,
    "Secrets in requests"). Unset: the host's CAs only."""
