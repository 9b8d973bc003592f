"""Domain rules through the official SDK, in a gVisor sandbox (docs/security.md, "Egress"):
``Sandbox.create(network=...)`` with names and the SDK's callable selectors, then HTTP, HTTPS
and DNS from inside against real servers in a namespace standing in for the internet, which
a local DNS server resolves (tests/network/egress_world.py); ``update_network`` live. The
node resolves with that server only (``egress_resolvers``): nothing leaves the machine."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

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
        ctx = ssl.create_default_context()  # "https-verified": as any client would
        if kind != "https-verified":
            ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        scheme = kind.split("-")[0]
        with urllib.request.urlopen(f"{scheme}://{target}/", timeout=5, context=ctx) as r:
            out.append([r.status, r.read().decode()])
    except urllib.error.HTTPError as exc:
        out.append([exc.code, exc.read().decode()[:80]])
    except (OSError, urllib.error.URLError) as exc:
        out.append(["error", type(getattr(exc, "reason", exc)).__name__])
    except Exception as exc:  # http.client's, on a connection closed mid-answer
        out.append(["error", type(exc).__name__])
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
    # The node trusts the world's CA as it would a public one, for its side of the HTTPS it
    # ends for header rules.
    with serving(egress_resolvers=json.dumps([world.dns_ip]),
                 egress_upstream_ca_file=str(world.ca_file)) as server:
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
    keyed = [200, f"A allowed.test key={key_digest(SECRET)}"]
    try:
        found = _probe(sbx, ("http", "allowed.test"), ("http", "sub.wild.test"),
                       ("https-verified", "allowed.test"), ("https-verified", "sub.wild.test"),
                       ("https", "sub.wild.test"))
        # Over HTTPS too, checked by the sandbox's own client: it trusts the platform's CA,
        # which answers for the rule's host only; another host is not intercepted (its
        # certificate is the world's, which the sandbox does not trust, and unchecked it
        # answers without the key).
        assert found == [keyed, [200, "A sub.wild.test"], keyed,
                         ["error", "SSLCertVerificationError"],
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
        # The scan works: a string a living process holds is found.
        sbx.commands.run("python3 -c \"import time; held = '-'.join(['scan', 'marker', "
                         "'held']) * 4; time.sleep(600)\"", background=True)
        time.sleep(1)
        assert _guest_memory_holds(sbx.sandbox_id, b"scan-marker-held" * 4)
        assert not _guest_memory_holds(sbx.sandbox_id, SECRET.encode())
    finally:
        sbx.kill()


def test_rules_given_live_bring_the_platform_ca_with_them(node: NodeServer) -> None:
    """``update_network`` with rules on a sandbox created without: the sandbox trusts the
    platform's CA from then on, and its HTTPS to the rule's host carries the header."""
    sbx = Sandbox.create(timeout=120, network={"allow_out": ["allowed.test"],
                                                "deny_out": ["0.0.0.0/0"]})
    try:
        before = _probe(sbx, ("https-verified", "allowed.test"))
        assert before == [["error", "SSLCertVerificationError"]], before  # the world's cert
        sbx.update_network({"allow_out": ["allowed.test"], "deny_out": ["0.0.0.0/0"],
                            "rules": {"allowed.test": [{"transform": {"headers": {
                                "X-Api-Key": "plain-value"}}}]}})
        after = _probe(sbx, ("https-verified", "allowed.test"))
        assert after == [[200, f"A allowed.test key={key_digest('plain-value')}"]], after
        env = sbx.commands.run("echo $SSL_CERT_FILE").stdout.strip()
        assert env == "/etc/ssl/certs/ca-certificates.crt", env
    finally:
        sbx.kill()


def test_workload_identity_tokens_reach_their_host_signed_and_verifiable(
        node: NodeServer, world: World) -> None:
    """E2B ``iam``: a rule's ``ctx.iam.tokens[name]`` becomes a JWT-SVID the node mints for
    the sandbox, which the host receives over HTTPS and verifies with the keys the node
    publishes; the sandbox never sees it. An unregistered name is refused by the SDK, a
    token type the platform does not mint by the API."""
    import httpx
    import jwt
    from e2b import Secret
    from e2b.exceptions import InvalidArgumentException, SandboxException

    def transform(ctx: Any) -> dict[str, Any]:
        return {"headers": {"Authorization": f"Bearer {ctx.iam.tokens['api']}"}}

    before = world.authorizations.read_text().count("\n")
    sbx = Sandbox.create(timeout=120, iam={"tokens": {"api": Secret.iam_token(
        audience="https://allowed.test", token_type="JWT-SVID")}}, network={
        "allow_out": ["allowed.test"], "deny_out": ["0.0.0.0/0"],
        "rules": {"allowed.test": [{"transform": transform}]}})
    try:
        found = _probe(sbx, ("https-verified", "allowed.test"), ("http", "allowed.test"))
        assert found == [[200, "A allowed.test authorized"]] * 2, found
        tokens = world.authorizations.read_text().splitlines()[before:]
        assert len(tokens) == 2 and all(t.startswith("Bearer ") for t in tokens), tokens
        token = tokens[0].removeprefix("Bearer ")
        keys = jwt.PyJWKSet.from_dict(httpx.get(f"{node.url}/.well-known/jwks.json").json())
        discovery = httpx.get(f"{node.url}/.well-known/openid-configuration").json()
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, next(k for k in keys.keys if k.key_id == header["kid"]),
                            algorithms=["ES256"], audience="https://allowed.test",
                            issuer=discovery["issuer"])
        assert claims["sub"].endswith(f"/sandbox/{sbx.sandbox_id}"), claims
        assert claims["exp"] - claims["iat"] <= 300
        with pytest.raises(jwt.InvalidAudienceError):
            jwt.decode(token, keys.keys[0], algorithms=["ES256"], audience="https://other")
        inside = sbx.commands.run("env; cat /proc/*/environ 2>/dev/null", timeout=30)
        assert token not in inside.stdout
    finally:
        sbx.kill()
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(timeout=60, iam={"tokens": {"api": Secret.iam_token(
            audience="x", token_type="JWT-SVID")}}, network={"rules": {"allowed.test": [
                {"transform": lambda ctx: {"headers": {"A": ctx.iam.tokens["nope"]}}}]}})
    with pytest.raises(SandboxException):
        Sandbox.create(timeout=60, iam={"tokens": {"api": Secret.iam_token(
            audience="x", token_type="X509-SVID")}})
