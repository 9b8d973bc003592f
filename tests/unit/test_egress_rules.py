"""The egress proxy's pure parts: name patterns, the verdict order, and the SNI parser (on a
real ClientHello made by Python's own TLS client)."""

from __future__ import annotations

import ssl

from aenv.core.net import EgressPolicy
from aenv.network.egress_names import sni_of
from aenv.network.egress_proxy import transform_for
from aenv.network.egress_rules import by_address, by_name, matches

NEVER = ("127.0.0.0/8", "169.254.0.0/16")
INTERNAL = ("10.0.0.0/8",)


def _client_hello(server_name: str | None) -> bytes:
    """The body of the first TLS record a client sends (its ClientHello)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        client.do_handshake()
    except ssl.SSLWantReadError:
        pass
    record = outgoing.read()
    assert record[0] == 22  # a handshake record
    return record[5:5 + int.from_bytes(record[3:5], "big")]


def test_the_sni_of_a_real_client_hello() -> None:
    assert sni_of(_client_hello("API.Example.com")) == "api.example.com"
    assert sni_of(_client_hello(None)) is None
    assert sni_of(b"") is None and sni_of(b"\x01\x00") is None
    assert sni_of(_client_hello("a.test")[:40]) is None  # cut short: no name, no crash


def test_wildcards_match_subdomains_only() -> None:
    assert matches("x.svc.test", ["*.svc.test"]) and matches("a.b.svc.test", ["*.svc.test"])
    assert not matches("svc.test", ["*.svc.test"]) and not matches("xsvc.test", ["*.svc.test"])
    assert matches("API.test.", ["api.test"])


def test_allowed_names_win_and_the_node_stays_out_of_reach() -> None:
    policy = EgressPolicy(allow_domains=("ok.test",), deny_domains=("*.bad.test",),
                          deny_out=("0.0.0.0/0",))
    assert by_name(policy, "ok.test") is not None and by_name(policy, "ok.test").allowed
    assert by_name(policy, "x.bad.test") is not None and not by_name(policy, "x.bad.test").allowed
    assert by_name(policy, "other.test") is None
    # Through an allowed name: past deny_out, not into the node's own or internal ranges.
    assert by_address(policy, "203.0.113.5", never=NEVER, internal=INTERNAL, named=True).allowed
    assert not by_address(policy, "10.1.2.3", never=NEVER, internal=INTERNAL, named=True).allowed
    assert not by_address(policy, "169.254.169.254", never=NEVER, internal=INTERNAL,
                          named=True).allowed
    # An address without a name: deny_out decides; allow_out opens even an internal range.
    assert not by_address(policy, "203.0.113.5", never=NEVER, internal=INTERNAL).allowed
    opened = EgressPolicy(allow_out=("10.0.0.0/8",), deny_out=("0.0.0.0/0",))
    assert by_address(opened, "10.1.2.3", never=NEVER, internal=INTERNAL).allowed
    closed = EgressPolicy(allow_internet=False)
    assert not by_address(closed, "203.0.113.5", never=NEVER, internal=INTERNAL).allowed


def test_a_host_gets_the_first_matching_rule_only() -> None:
    policy = EgressPolicy(transforms=(("api.test", (("X", "1"),)), ("*.test", (("X", "2"),))))
    assert transform_for(policy, "api.test") == (("X", "1"),)
    assert transform_for(policy, "b.test") == (("X", "2"),)
    assert transform_for(policy, "api.other") == ()
