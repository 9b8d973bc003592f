"""Domain rules through the official SDK, in a gVisor sandbox (docs/security.md, "Egress"):
``Sandbox.create(network=...)`` with names and the SDK's callable selectors, then HTTP, HTTPS
and DNS from inside against real servers in a namespace standing in for the internet, which
a local DNS server resolves (tests/network/egress_world.py); ``update_network`` live. The
node resolves with that server only (``egress_resolvers``): nothing leaves the machine."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.network.egress_world import World, egress_world
from tests.network.peers import InternetPeer
from tests.server.harness import NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(300)]

#: In the sandbox: argv's requests, one outcome each, as JSON.
PROBE = r"""
import json, socket, ssl, sys, urllib.request, urllib.error
out = []
for kind, target in json.loads(sys.argv[1]):
    try:
        if kind == "resolve":
            out.append(sorted({a[4][0] for a in socket.getaddrinfo(target, 80, socket.AF_INET)}))
            continue
        ctx = ssl.create_default_context(); ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(f"{kind}://{target}/", timeout=5, context=ctx) as r:
            out.append([r.status, r.read().decode()])
    except urllib.error.HTTPError as exc:
        out.append([exc.code, exc.read().decode()[:80]])
    except (OSError, urllib.error.URLError) as exc:
        out.append(["error", type(getattr(exc, "reason", exc)).__name__])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    peer = InternetPeer()
    peer.start()
    try:
        with egress_world(peer) as made:
            yield made
    finally:
        peer.stop()


@pytest.fixture(scope="module")
def node(world: World) -> Iterator[NodeServer]:
    with serving(egress_resolvers=json.dumps([world.dns_ip])) as server:
        yield server


def _probe(sbx: Sandbox, *requests: tuple[str, str]) -> list[object]:
    sbx.files.write("/tmp/probe.py", PROBE)
    ran = sbx.commands.run(f"python3 /tmp/probe.py '{json.dumps(requests)}'", timeout=60)
    result: list[object] = json.loads(ran.stdout)
    return result


def test_names_decide_inside_a_sandbox_and_update_live(node: NodeServer, world: World) -> None:
    sbx = Sandbox.create(timeout=120, network={
        "allow_out": lambda ctx: ["allowed.test", "*.wild.test"],
        "deny_out": lambda ctx: [ctx.all_traffic],
    })
    try:
        info = sbx.get_info()
        assert info.network is not None
        found = _probe(sbx, ("http", "allowed.test"), ("https", "allowed.test"),
                       ("http", "sub.wild.test"), ("http", "denied.test"),
                       ("http", world.b_ip), ("https", "denied.test"),
                       ("resolve", "allowed.test"), ("resolve", "denied.test"))
        assert found[0] == [200, "A allowed.test"], found
        assert found[1] == [200, "A allowed.test"], found
        assert found[2] == [200, "A sub.wild.test"], found
        # denied.test does not even resolve; its address is refused by the proxy.
        assert found[3][0] == "error" and found[4][0] == 403, found  # type: ignore[index]
        assert found[5][0] == "error", found  # type: ignore[index]
        assert found[6] == [world.a_ip] and found[7][0] == "error", found  # type: ignore[index]
        # Live: denied.test allowed from the next connection on.
        sbx.update_network({"allow_out": ["allowed.test", "denied.test"],
                            "deny_out": ["0.0.0.0/0"]})
        again = _probe(sbx, ("http", "denied.test"), ("http", "allowed.test"))
        assert again == [[200, "B denied.test"], [200, "A allowed.test"]], again
        # allow_internet_access=False closes what no allowed name opens.
        closed = Sandbox.create(timeout=60, allow_internet_access=False,
                                network={"allow_out": ["allowed.test"]})
        try:
            shut = _probe(closed, ("http", "allowed.test"), ("http", world.b_ip))
            assert shut[0] == [200, "A allowed.test"] and shut[1][0] == 403, shut  # type: ignore[index]
        finally:
            closed.kill()
    finally:
        sbx.kill()
