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

from tests.network.egress_world import World, egress_world, key_digest
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


SECRET = "sk-test-5ecret-never-inside"


def _guest_memory_holds(sandbox_id: str, needle: bytes) -> bool:
    """Whether the guest memory of ``sandbox_id`` (the ``runsc-memory`` memfd of its
    runsc-sandbox process) holds ``needle``."""
    from pathlib import Path

    pids = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    for proc in pids:
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"runsc-sandbox" not in cmdline or sandbox_id.encode() not in cmdline:
            continue
        for fd in (proc / "fd").iterdir():
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if "runsc-memory" not in target:
                continue
            with open(fd, "rb") as memory:
                tail = b""
                while chunk := memory.read(1 << 24):
                    if needle in tail + chunk:
                        return True
                    tail = chunk[-len(needle):]
            return False
    raise AssertionError(f"no runsc-sandbox memory found for {sandbox_id}")


def test_a_secret_reaches_its_host_and_is_nowhere_in_the_sandbox(
        node: NodeServer, world: World) -> None:
    import httpx

    from tests.server.harness import API_KEY

    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}) as api:
        made = api.post("/secrets", json={"name": "upstream", "value": SECRET})
        assert made.status_code == 201, made.text
    sbx = Sandbox.create(timeout=120, network={
        "allow_out": ["allowed.test", "*.wild.test"],
        "deny_out": lambda ctx: [ctx.all_traffic],
        "rules": {"allowed.test": [{"transform": {"headers": {
            "X-Api-Key": "${e2b.secrets.upstream}"}}}]},
    })
    try:
        found = _probe(sbx, ("http", "allowed.test"), ("http", "sub.wild.test"))
        assert found == [[200, f"A allowed.test key={key_digest(SECRET)}"],
                         [200, "A sub.wild.test"]], found
        # Nowhere inside: not in any process's environment, not in a file it can read. (The
        # pattern is written so that the command itself does not carry the secret in.)
        pattern = f"{SECRET[:-1]}[{SECRET[-1]}]"
        probe = sbx.commands.run(
            f"env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
            f"grep -rIl --exclude-dir=proc --exclude-dir=sys -e '{pattern}' / 2>/dev/null "
            "|| true", timeout=120)
        assert SECRET not in probe.stdout, probe.stdout[-2000:]
        # Nor in its memory: gVisor keeps the guest's memory in a memfd of its sandbox
        # process, read here from the host.
        assert _guest_memory_holds(sbx.sandbox_id, b"A allowed.test key=")  # the scan works
        assert not _guest_memory_holds(sbx.sandbox_id, SECRET.encode())
    finally:
        sbx.kill()
