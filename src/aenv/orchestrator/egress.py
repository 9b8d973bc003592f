"""E2B's network options -> the slot's egress policy.

``allow_internet_access: false`` closes the internet; ``network.allowOut`` / ``denyOut`` name
IPv4 addresses, CIDRs and domain names (``api.example.com``, ``*.example.com``). Addresses
are enforced per packet by nft (network/nft.py); names, for HTTP and HTTPS, by the node's
egress proxy on the request's Host or TLS SNI, with the sandbox's DNS answered by the node
(network/egress_proxy.py). An allowed name or address wins (E2B's order). ``dnsServers`` is
accepted and kept (E2B opens its firewall to them); here every DNS query of a sandbox with
domain rules is answered by the node, whichever server it is sent to.
``network.egressProxy`` sends every TCP connection the rules allow through a SOCKS5
upstream (network/socks_upstream.py).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from aenv.core.errors import InvalidArgument
from aenv.core.net import EgressPolicy
from aenv.network.egress_rules import domain_pattern
from aenv.network.socks_upstream import SocksUpstream
from aenv.orchestrator.workload_identity import TokenSpec
from aenv.store.models import SandboxRecord

#: At most this many entries in allowOut or denyOut.
MAX_ENTRIES = 1000


def _entries(value: Any, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(addresses and CIDRs, domain patterns) of one list."""
    if value is None:
        return (), ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"network.{name} must be a list of IPv4 addresses, CIDRs or "
                              "domain names")
    if len(value) > MAX_ENTRIES:
        raise InvalidArgument(f"network.{name} has more than {MAX_ENTRIES} entries")
    cidrs: list[str] = []
    domains: list[str] = []
    for entry in value:
        try:
            pattern = domain_pattern(entry)
        except InvalidArgument as exc:
            raise InvalidArgument(f"network.{name}: {exc.message}") from None
        if pattern is not None:
            domains.append(pattern)
            continue
        net = ipaddress.ip_network(entry.strip(), strict=False)
        if net.version != 4:
            raise InvalidArgument(f"network.{name}: {entry!r}: sandboxes have no IPv6 egress")
        cidrs.append(str(net))
    return tuple(cidrs), tuple(domains)


def _dns_servers(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > 10 or not all(
            isinstance(v, str) for v in value):
        raise InvalidArgument("network.dnsServers must be a list of at most 10 IPv4 addresses")
    for entry in value:
        try:
            ipaddress.IPv4Address(entry)
        except ValueError:
            raise InvalidArgument(f"network.dnsServers: {entry!r} is not an IPv4 address"
                                  ) from None


#: A value's placeholders: ``${e2b.secrets.<name>}``, and ``${e2b.identity.tokens.<name>}``
#: of a token the sandbox's ``iam`` registers (orchestrator/workload_identity.py).
PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
SECRET = re.compile(r"^e2b\.secrets\.([A-Za-z0-9_-]{1,128})$")
IDENTITY_PREFIX = "e2b.identity.tokens."
MAX_HEADERS = 32


def _transforms(value: Any, tokens: frozenset[str] | None,
                ) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """The rules' headers; ``tokens``: the names of the sandbox's iam tokens (None: not known
    here, as for a live update, whose body carries no iam: checked against the record)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > 100:
        raise InvalidArgument("network.rules must map at most 100 hosts to lists of rules")
    out = []
    for host, rules in value.items():
        pattern = domain_pattern(host) if isinstance(host, str) else None
        if pattern is None:
            raise InvalidArgument(f"network.rules: {host!r}: rules are keyed by domain name")
        if not isinstance(rules, list):
            raise InvalidArgument(f"network.rules[{host!r}] must be a list of rules")
        headers: dict[str, str] = {}
        for rule in rules:
            transform = rule.get("transform") if isinstance(rule, dict) else rule
            if transform is not None and not isinstance(transform, dict):
                raise InvalidArgument(f"network.rules[{host!r}]: a rule is an object with an "
                                      "optional transform object")
            given = transform.get("headers") if transform is not None else None
            if given is not None and not isinstance(given, dict):
                raise InvalidArgument(f"network.rules[{host!r}]: headers must be an object")
            for name, text in (given or {}).items():
                if not (isinstance(name, str) and isinstance(text, str)) or not name.strip() \
                        or any(c in name + text for c in "\r\n"):
                    raise InvalidArgument(f"network.rules[{host!r}]: headers are one-line "
                                          "strings")
                for placeholder in PLACEHOLDER.findall(text):
                    if SECRET.match(placeholder):
                        continue
                    token = placeholder.removeprefix(IDENTITY_PREFIX)
                    if token == placeholder:
                        raise InvalidArgument(
                            f"network.rules[{host!r}]: ${{{placeholder}}} is neither "
                            "${e2b.secrets.<name>} nor ${e2b.identity.tokens.<name>}")
                    if tokens is not None and token not in tokens:
                        raise InvalidArgument(
                            f"network.rules[{host!r}]: iam token {token!r} is not "
                            "registered in the sandbox's iam.tokens")
                headers[name] = text
        if len(headers) > MAX_HEADERS:
            raise InvalidArgument(f"network.rules[{host!r}]: at most {MAX_HEADERS} headers")
        out.append((pattern, tuple(headers.items())))
    return tuple(out)


def policy_from(allow_internet_access: bool | None, network: dict[str, Any] | None,
                team_id: str | None = None, *, identity: tuple[TokenSpec, ...] = (),
                sandbox_id: str | None = None) -> EgressPolicy:
    """``identity``: the sandbox's iam tokens, which its rules may name; ``sandbox_id``: whom
    they are minted for."""
    network = network or {}
    allow, allow_domains = _entries(network.get("allowOut"), "allowOut")
    deny, deny_domains = _entries(network.get("denyOut"), "denyOut")
    _dns_servers(network.get("dnsServers"))
    proxy = network.get("egressProxy")
    upstream = SocksUpstream.parse(proxy) if proxy is not None else None
    return EgressPolicy(
        allow_internet=allow_internet_access is not False,
        allow_out=allow, deny_out=deny,
        allow_domains=allow_domains, deny_domains=deny_domains,
        transforms=_transforms(network.get("rules"), frozenset(t.name for t in identity)),
        team_id=team_id,
        identity=tuple((t.name, t.audience, t.token_type) for t in identity),
        sandbox_id=sandbox_id,
        egress_proxy=(json.dumps(upstream.as_json(with_secrets=True), sort_keys=True)
                      if upstream is not None else None),
    )


def shown(network: dict[str, Any] | None) -> dict[str, Any] | None:
    """``network`` as a sandbox's info shows it: its ``egressProxy`` without the password
    and the CA (E2B's ``SandboxEgressProxyInfo``)."""
    if not network or network.get("egressProxy") is None:
        return network
    try:
        proxy = SocksUpstream.parse(network["egressProxy"]).as_json()
    except InvalidArgument:
        proxy = None
    return {**network, "egressProxy": proxy}


def policy_of(record: SandboxRecord) -> EgressPolicy:
    """The policy a sandbox's record says (its rules were checked when they were given)."""
    return policy_from(record.allow_internet_access, record.network, record.team_id,
                       identity=identity_of(record), sandbox_id=record.sandbox_id)


def identity_of(record: SandboxRecord) -> tuple[TokenSpec, ...]:
    return tuple(TokenSpec(**t) for t in record.identity_tokens or ())
