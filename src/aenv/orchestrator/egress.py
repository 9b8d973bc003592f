"""E2B's network options -> the slot's egress policy.

``allow_internet_access: false`` closes the internet; ``network.allowOut`` / ``denyOut`` name
IPv4 addresses or CIDRs (``0.0.0.0/0`` in ``denyOut`` denies everything ``allowOut`` does not
name). Domain names are not supported yet and are refused with a clear error.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from aenv.core.errors import InvalidArgument
from aenv.core.net import EgressPolicy


def _cidrs(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"network.{name} must be a list of IPv4 addresses or CIDRs")
    out = []
    for entry in value:
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise InvalidArgument(
                f"network.{name}: {entry!r} is not an IPv4 address or CIDR "
                "(domain rules are not supported yet)"
            ) from None
        if net.version != 4:
            raise InvalidArgument(f"network.{name}: {entry!r}: sandboxes have no IPv6 egress")
        out.append(str(net))
    return tuple(out)


def policy_from(allow_internet_access: bool | None, network: dict[str, Any] | None) -> EgressPolicy:
    network = network or {}
    return EgressPolicy(
        allow_internet=allow_internet_access is not False,
        allow_out=_cidrs(network.get("allowOut"), "allowOut"),
        deny_out=_cidrs(network.get("denyOut"), "denyOut"),
    )
