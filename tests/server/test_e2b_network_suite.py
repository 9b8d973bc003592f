"""E2B's own Python SDK network tests (``tests/sync/sandbox_sync/test_network.py`` of the
e2b repository, SDK 2.63), case by case through the official SDK, with the public addresses
they reach (``https://1.1.1.1`` answering 301, ``https://8.8.8.8`` 302) stood up on this
machine (tests/network/egress_world.py, ``public=True``) and ``curl`` in the sandbox as
theirs. The stand-ins' CA is put in each sandbox's trust as a public CA is in an image's.

Their header-transform case sends to a second sandbox through its public HTTPS host; here the
target is the local world's ``allowed.test`` over HTTPS (the node ends that TLS with its CA,
as E2B's proxy does). The inbound cases over ``https://<get_host>`` need a wildcard
certificate for the sandbox domain: their HTTP equivalents are in test_inbound_traffic.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxNetworkOpts
from e2b.sandbox.commands.command_handle import CommandExitException

from tests.network.egress_world import World, egress_world, key_digest, socks5
from tests.network.peers import InternetPeer
from tests.server.harness import NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(300)]

CODE = "curl -s -o /dev/null -w '%{http_code}' https://{}"
REFUSED = "curl --connect-timeout 3 --max-time 5 -Is https://{}"


@pytest.fixture(scope="module")
def peer() -> Iterator[InternetPeer]:
    made = InternetPeer()
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def world(peer: InternetPeer) -> Iterator[World]:
    with egress_world(peer, public=True) as made:
        yield made


@pytest.fixture(scope="module")
def node(world: World) -> Iterator[NodeServer]:
    with serving(egress_resolvers=json.dumps([world.dns_ip]),
                 egress_upstream_ca_file=str(world.ca_file)) as server:
        yield server


@pytest.fixture
def sandbox_factory(node: NodeServer, world: World) -> Iterator[object]:
    made: list[Sandbox] = []

    def factory(**options: object) -> Sandbox:
        sbx = Sandbox.create(timeout=options.pop("timeout", 120), **options)  # type: ignore[arg-type]
        made.append(sbx)
        sbx.files.write("/tmp/world-ca.pem", world.ca_file.read_text())
        sbx.commands.run("cat /tmp/world-ca.pem >> /etc/ssl/certs/ca-certificates.crt",
                         user="root")
        return sbx

    yield factory
    for sbx in made:
        sbx.kill()


def _code(sbx: Sandbox, address: str) -> str:
    result = sbx.commands.run(CODE.replace("{}", address))
    assert result.exit_code == 0
    return result.stdout.strip()


def _refused(sbx: Sandbox, address: str) -> None:
    with pytest.raises(CommandExitException) as exc_info:
        sbx.commands.run(REFUSED.replace("{}", address))
    assert exc_info.value.exit_code != 0


def test_allow_specific_ip_with_deny_all(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory(network=SandboxNetworkOpts(
        deny_out=lambda ctx: [ctx.all_traffic], allow_out=["1.1.1.1"]))
    assert _code(sbx, "1.1.1.1") == "301"
    _refused(sbx, "8.8.8.8")


def test_deny_specific_ip(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory(network=SandboxNetworkOpts(deny_out=["8.8.8.8"]))
    _refused(sbx, "8.8.8.8")
    assert _code(sbx, "1.1.1.1") == "301"


def test_deny_all_traffic(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory(network=SandboxNetworkOpts(deny_out=lambda ctx: [ctx.all_traffic]),
                          timeout=30)
    _refused(sbx, "1.1.1.1")
    _refused(sbx, "8.8.8.8")


def test_allow_takes_precedence_over_deny(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory(network=SandboxNetworkOpts(
        deny_out=lambda ctx: [ctx.all_traffic], allow_out=["1.1.1.1", "8.8.8.8"]))
    assert _code(sbx, "1.1.1.1") == "301"
    assert _code(sbx, "8.8.8.8") == "302"


def test_firewall_transform_injects_headers(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    value = "e2b-transform-value-123"
    network: SandboxNetworkOpts = {"rules": {"allowed.test": [
        {"transform": {"headers": {"X-Api-Key": value}}}]}}
    sbx = sandbox_factory(network=network)
    result = sbx.commands.run("curl -sS --retry 5 --retry-connrefused --max-time 10 "
                              "https://allowed.test/headers")
    assert result.exit_code == 0
    assert result.stdout == f"A allowed.test key={key_digest(value)}", result.stdout


def test_update_network_applies_restrictions(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory()
    assert _code(sbx, "8.8.8.8") == "302"
    sbx.update_network({"deny_out": ["8.8.8.8"]})
    _refused(sbx, "8.8.8.8")
    assert _code(sbx, "1.1.1.1") == "301"


def test_update_network_clears_existing_rules(sandbox_factory) -> None:  # type: ignore[no-untyped-def]
    sbx = sandbox_factory(network=SandboxNetworkOpts(
        deny_out=lambda ctx: [ctx.all_traffic], allow_out=["1.1.1.1"]))
    _refused(sbx, "8.8.8.8")
    sbx.update_network({})
    assert _code(sbx, "1.1.1.1") == "301"
    assert _code(sbx, "8.8.8.8") == "302"


def test_egress_proxy_tunnels_the_sandbox_and_hides_its_password(
        sandbox_factory, peer: InternetPeer) -> None:  # type: ignore[no-untyped-def]
    """``network.egress_proxy`` (a real SOCKS5 server standing in for the user's): the
    sandbox's TCP leaves through it, info shows it without the password, and an update that
    leaves it out sends the sandbox straight out again (the SDK's replace semantics)."""
    from tests.network.peers import ECHO_PORT

    greet = (f"python3 -c \"import socket; s = socket.create_connection(('{peer.ip}', "
             f"{ECHO_PORT}), timeout=5); print(s.makefile().readline().split()[1])\"")
    with socks5(peer, "agent", "s3cret-pass") as address:
        sbx = sandbox_factory(network=SandboxNetworkOpts(egress_proxy={
            "address": address, "username": "agent", "password": "s3cret-pass"}))
        seen = sbx.commands.run(greet).stdout.strip()
        assert seen.split(":")[0] == peer.ip, seen  # the proxy's address, not the node's
        assert _code(sbx, "1.1.1.1") == "301"       # HTTPS through it too
        network = sbx.get_info().network
        assert network is not None
        shown = network.get("egress_proxy") or network.get("egressProxy")
        assert shown and shown["address"] == address and "password" not in shown, network
        sbx.update_network({})
        seen = sbx.commands.run(greet).stdout.strip()
        assert seen.split(":")[0] == peer.host_ip, seen
