"""Domain rules for egress (network/egress_proxy.py): a slot's guest (Linux's own stack in the
slot's namespace: fast, and it is the node's side that is tested) reaches real HTTP, HTTPS
and DNS servers in a namespace standing in for the internet (egress_world.py), resolved by
a local DNS server; the node's proxy decides on the Host header, the TLS SNI and the query
name. Allowed and denied names, wildcards, an IP literal of a denied name, a second resolver,
a forged Host and a forged SNI, DNS, and a live update that keeps an open connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from aenv.core.net import EgressPolicy, NetSlot
from aenv.network import nft
from aenv.network.egress_tls import Interception
from aenv.network.pool import SlotPool
from aenv.orchestrator.egress import policy_from
from tests.network.egress_world import World, egress_world, key_digest, socks5
from tests.network.fixtures import ours, pool_config, shut
from tests.network.peers import ECHO_PORT, InternetPeer

pytestmark = [pytest.mark.gvisor, pytest.mark.anyio]

#: Run in the guest: each request of argv[1] (JSON), its outcome on one line of JSON.
CLIENT = r"""
import json, socket, ssl, sys
import dns.message, dns.query, dns.rcode, dns.exception

def http(ip, host, port=80, tls=False, cafile=None):
    sock = socket.create_connection((ip, port), timeout=3)
    if cafile:  # checked as a client would: the name, against this CA only
        sock = ssl.create_default_context(cafile=cafile).wrap_socket(
            sock, server_hostname=host)
    elif tls:
        ctx = ssl.create_default_context(); ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        sock = ctx.wrap_socket(sock, server_hostname=host)
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                   if l.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    status = int(head.split(b" ")[1]) if head else 0
    return sock, status, body.decode(errors="replace")

out = []
for kind, *args in json.loads(sys.argv[1]):
    try:
        if kind == "dns":
            server, name = args
            reply = dns.query.udp(dns.message.make_query(name, "A"), server, timeout=3)
            out.append({"rcode": dns.rcode.to_text(reply.rcode()),
                        "a": sorted(r.to_text() for rr in reply.answer for r in rr)})
        elif kind == "echo":  # the echo server's greeting: who it saw connect
            ip, port = args
            with socket.create_connection((ip, int(port)), timeout=5) as sock:
                line = sock.makefile().readline().strip()
            out.append({"greeting": line} if line else {"error": "closed"})
        elif kind == "https-ca":
            ip, host, cafile = args
            sock, status, body = http(ip, host, port=443, cafile=cafile)
            sock.close()
            out.append({"status": status, "body": body})
        else:
            sock, status, body = http(*args, tls=kind == "https",
                                      port=443 if kind == "https" else 80)
            sock.close()
            out.append({"status": status, "body": body})
    except ssl.SSLCertVerificationError as exc:
        out.append({"error": "SSLCertVerificationError", "why": exc.verify_message})
    except (OSError, dns.exception.DNSException) as exc:
        out.append({"error": type(exc).__name__})
print(json.dumps(out))
"""

#: Keeps one HTTP connection open across a policy update: a request, "wait" on stdout, a
#: line on stdin, a second request on the same connection.
KEEP = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], 80), timeout=5)
def ask():
    sock.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    data = b""
    while not data.endswith(b"A allowed.test"):
        chunk = sock.recv(4096)
        if not chunk:
            return "closed"
        data += chunk
    return "ok"
print(ask(), flush=True)
sys.stdin.readline()
print(ask(), flush=True)
"""


async def _guest(slot: NetSlot, requests: list[list[str]]) -> list[dict[str, object]]:
    child = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/run/netns/{slot.netns}", "--", sys.executable, "-c", CLIENT,
        json.dumps(requests), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    result: list[dict[str, object]] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def world(internet: InternetPeer) -> object:
    with egress_world(internet) as made:
        yield made


@pytest.fixture
async def proxied_pool(world: World) -> object:
    pool = SlotPool(pool_config(resolvers=(world.dns_ip,)))
    await pool.start()
    try:
        yield pool
    finally:
        await shut(pool)
    assert ours() == set(), "a test left network slots behind"


def _policy(**network: object) -> EgressPolicy:
    return policy_from(None, dict(network))


async def test_names_decide_http_https_and_dns(proxied_pool: SlotPool, world: World) -> None:
    policy = _policy(allowOut=["allowed.test", "*.wild.test"], denyOut=["0.0.0.0/0"])
    slot = await proxied_pool.acquire(policy)
    a, b = world.a_ip, world.b_ip
    results = await _guest(slot, [
        ["http", a, "allowed.test"],                 # 0 allowed by name
        ["https", a, "allowed.test"],                # 1 allowed by SNI
        ["http", a, "sub.wild.test"],                # 2 a wildcard's subdomain
        ["http", a, "wild.test"],                    # 3 not the wildcard's own name
        ["http", b, "denied.test"],                  # 4 not allowed: the internet is denied
        ["https", b, "denied.test"],                 # 5 the same over TLS (and DoH to it)
        ["http", b, b],                              # 6 the IP literal of a denied name
        ["http", b, "allowed.test"],                 # 7 forged Host: dialled B, reaches A
        ["https", b, "allowed.test"],                # 8 forged SNI: dialled B, reaches A
        ["dns", "192.0.2.53", "allowed.test"],       # 9 another resolver: answered by the node
        ["dns", world.dns_ip, "denied.test"],        # 10 a name it may not reach: NXDOMAIN
        ["dns", "192.0.2.53", "nowhere.test"],       # 11 an unknown name
    ])
    assert results[0] == {"status": 200, "body": "A allowed.test"}, results
    assert results[1] == {"status": 200, "body": "A allowed.test"}, results
    assert results[2] == {"status": 200, "body": "A sub.wild.test"}, results
    assert results[3]["status"] == 403 and "denied" in str(results[3]["body"]), results
    assert results[4]["status"] == 403, results
    assert results[5].get("status") != 200 and "B" not in str(results[5]), results
    assert results[6]["status"] == 403, results
    assert results[7] == {"status": 200, "body": "A allowed.test"}, results  # never B
    assert results[8] == {"status": 200, "body": "A allowed.test"}, results
    assert results[9] == {"rcode": "NOERROR", "a": [a]}, results
    assert results[10]["rcode"] == "NXDOMAIN", results
    assert results[11]["rcode"] == "NXDOMAIN", results
    # Other ports stay with nft: the address rules (0.0.0.0/0 denied) drop them.
    echo = await _guest(slot, [["dns", world.dns_ip, "allowed.test"]])
    assert echo[0]["rcode"] == "NOERROR"


async def test_deny_by_name_with_the_internet_open(proxied_pool: SlotPool,
                                                   world: World) -> None:
    slot = await proxied_pool.acquire(_policy(denyOut=["denied.test"]))
    results = await _guest(slot, [
        ["http", world.b_ip, "denied.test"], ["https", world.b_ip, "denied.test"],
        ["http", world.a_ip, "allowed.test"], ["http", world.b_ip, world.b_ip],
        ["dns", "192.0.2.53", "denied.test"], ["dns", "192.0.2.53", "allowed.test"],
    ])
    assert results[0]["status"] == 403 and results[1].get("status") != 200, results
    assert results[2] == {"status": 200, "body": "A allowed.test"}, results
    # An IP literal is judged as an address: the internet is open, so B answers.
    assert results[3] == {"status": 200, "body": f"B {world.b_ip}"}, results
    assert results[4]["rcode"] == "NXDOMAIN" and results[5]["a"] == [world.a_ip], results


def _our_proxy_sockets() -> int:
    """This process's sockets bound to a port of the egress proxy (the tables of
    ``/proc/net`` hold the whole namespace's: only inodes among our descriptors count)."""
    ours: set[str] = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                ours.add(target[8:-1])
    ports = {nft.PROXY_HTTP_PORT, nft.PROXY_TLS_PORT, nft.PROXY_TUNNEL_PORT,
             nft.PROXY_DNS_PORT}
    found = 0
    for table in ("tcp", "udp"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) in ports and fields[9] in ours:
                found += 1
    return found


async def test_updates_racing_each_other_and_a_release_leave_one_proxy_or_none(
        proxied_pool: SlotPool, world: World) -> None:
    named = _policy(allowOut=["allowed.test"], denyOut=["0.0.0.0/0"])
    slot = await proxied_pool.acquire()
    # Two at once: the second used to bind the ports again (EADDRINUSE, a 500 on create).
    await asyncio.gather(*(proxied_pool.set_egress(slot, named) for _ in range(3)))
    results = await _guest(slot, [["http", world.a_ip, "allowed.test"]])
    assert results == [{"status": 200, "body": "A allowed.test"}], results
    assert _our_proxy_sockets() == 4  # one proxy: three TCP listeners and the DNS socket
    await proxied_pool.release(slot)
    # A release while the listeners are being made (the sandbox killed during its create):
    # nothing of them outlives it, at every point of the making.
    for steps in range(6):
        other = await proxied_pool.acquire()
        making = asyncio.create_task(proxied_pool.set_egress(other, named))
        for _ in range(steps):
            await asyncio.sleep(0)
        await proxied_pool.release(other)
        with contextlib.suppress(Exception):  # refused once released: fine
            await making
        assert _our_proxy_sockets() == 0, f"listeners outlived the release ({steps} steps in)"
        table = await nft.read_table()
        assert table is not None
        assert other.index not in table.slots and other.index not in table.chains, (
            f"the policy's rules outlived the release ({steps} steps in)")


async def test_a_live_update_applies_to_the_next_connection_and_keeps_open_ones(
        proxied_pool: SlotPool, world: World) -> None:
    slot = await proxied_pool.acquire(_policy(allowOut=["allowed.test"],
                                              denyOut=["0.0.0.0/0"]))
    keep = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/run/netns/{slot.netns}", "--", sys.executable, "-c", KEEP,
        world.a_ip, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert keep.stdout is not None and keep.stdin is not None
    assert (await asyncio.wait_for(keep.stdout.readline(), 30)).strip() == b"ok"
    assert (await _guest(slot, [["http", world.b_ip, "denied.test"]]))[0]["status"] == 403
    await proxied_pool.set_egress(slot, _policy(allowOut=["allowed.test", "denied.test"],
                                                denyOut=["0.0.0.0/0"]))
    assert (await _guest(slot, [["http", world.b_ip, "denied.test"]]))[0] == {
        "status": 200, "body": "B denied.test"}
    keep.stdin.write(b"go\n")
    await keep.stdin.drain()
    assert (await asyncio.wait_for(keep.stdout.readline(), 30)).strip() == b"ok"
    await keep.wait()
    # Back to addresses only: nothing is intercepted, the address rules decide alone.
    await proxied_pool.set_egress(slot, _policy(denyOut=["0.0.0.0/0"]))
    assert (await _guest(slot, [["http", world.a_ip, "allowed.test"]]))[0] == {
        "error": "TimeoutError"}


#: A guest request that sends its own X-Api-Key, twice on one connection.
TWICE = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], 80), timeout=5)
for _ in range(2):
    sock.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Api-Key: guest\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or b"key=" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    print(data.split(b"\r\n\r\n", 1)[1].decode(), flush=True)
"""


async def test_a_rule_puts_a_secret_into_requests_to_its_host_only(
        proxied_pool: SlotPool, world: World) -> None:
    asked: list[tuple[str | None, str]] = []

    async def reveal(team: str | None, name: str) -> str | None:
        asked.append((team, name))
        return "s3cr3t" if name == "api" else None

    proxied_pool.proxy.reveal = reveal
    policy = policy_from(None, {
        "allowOut": ["allowed.test", "*.wild.test", "denied.test"], "denyOut": ["0.0.0.0/0"],
        "rules": {"allowed.test": [{"transform": {"headers": {
                      "X-Api-Key": "${e2b.secrets.api}"}}}],
                  "denied.test": [{"transform": {"headers": {
                      "X-Api-Key": "${e2b.secrets.missing}"}}}]},
    }, team_id="team-1")
    slot = await proxied_pool.acquire(policy)
    results = await _guest(slot, [["http", world.a_ip, "allowed.test"],
                                  ["http", world.a_ip, "sub.wild.test"],
                                  ["http", world.b_ip, "denied.test"]])
    keyed = f"A allowed.test key={key_digest('s3cr3t')}"
    assert results[0] == {"status": 200, "body": keyed}, results
    assert results[1] == {"status": 200, "body": "A sub.wild.test"}, results  # no rule
    assert results[2]["status"] == 403 and "missing" in str(results[2]["body"]), results
    assert ("team-1", "api") in asked
    # The guest's own header of that name is replaced, on every request of a connection.
    child = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/run/netns/{slot.netns}", "--", sys.executable, "-c", TWICE,
        world.a_ip, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(child.communicate(), 30)
    assert out.decode().split() == ["A", "allowed.test", f"key={key_digest('s3cr3t')}"] * 2, out


async def test_https_to_a_host_with_rules_is_ended_by_the_platform_ca(
        proxied_pool: SlotPool, world: World, tmp_path: Path) -> None:
    """A rule's host over HTTPS: the guest, trusting the platform's CA, gets the answer with
    the secret put in; the node checks the real host's certificate (one not valid for its
    name is a 502, the secret never sent); a host without rules is not intercepted."""
    proxied_pool.proxy.reveal = _secret_api
    proxied_pool.proxy.interception = interception = Interception(
        b"operator key", tmp_path / "tls", upstream_cafile=world.ca_file)
    interception.prepare()
    platform_ca = tmp_path / "platform-ca.pem"
    platform_ca.write_text(interception.ca_pem)
    platform_ca.chmod(0o644)
    world_ca = str(world.ca_file)
    policy = policy_from(None, {
        "allowOut": ["allowed.test", "*.wild.test", "wild.test"], "denyOut": ["0.0.0.0/0"],
        "rules": {"allowed.test": [{"transform": {"headers": {
                      "X-Api-Key": "${e2b.secrets.api}"}}}],
                  "wild.test": [{"transform": {"headers": {
                      "X-Api-Key": "${e2b.secrets.api}"}}}]},
    }, team_id="team-1")
    slot = await proxied_pool.acquire(policy)
    results = await _guest(slot, [
        ["https-ca", world.a_ip, "allowed.test", str(platform_ca)],  # 0 intercepted
        ["https-ca", world.a_ip, "allowed.test", world_ca],          # 1 not the host's cert
        ["https-ca", world.a_ip, "sub.wild.test", world_ca],         # 2 no rule: untouched
        ["https-ca", world.a_ip, "sub.wild.test", str(platform_ca)],  # 3 ... so not ours
        ["https-ca", world.a_ip, "wild.test", str(platform_ca)],     # 4 upstream cert wrong
        ["https-ca", world.b_ip, "allowed.test", str(platform_ca)],  # 5 forged: dialled B
    ])
    keyed = f"A allowed.test key={key_digest('s3cr3t')}"
    assert results[0] == {"status": 200, "body": keyed}, results
    assert results[1]["error"] == "SSLCertVerificationError", results
    assert results[2] == {"status": 200, "body": "A sub.wild.test"}, results
    assert results[3]["error"] == "SSLCertVerificationError", results
    assert results[4]["status"] == 502 and "key=" not in str(results[4]["body"]), results
    assert results[5] == {"status": 200, "body": keyed}, results  # reaches A, by name
    # The CA is the operator key's: another proxy from the same key is trusted the same.
    again = Interception(b"operator key", tmp_path / "tls2")
    assert x509.load_pem_x509_certificate(again.ca_pem.encode()).public_key() == \
        x509.load_pem_x509_certificate(interception.ca_pem.encode()).public_key()


async def _secret_api(team: str | None, name: str) -> str | None:
    return "s3cr3t" if name == "api" and team == "team-1" else None


@pytest.fixture
def socks(internet: InternetPeer) -> Iterator[str]:
    with socks5(internet, "agent", "pässwort") as address:
        yield address


async def test_an_egress_proxy_carries_every_tcp_connection_the_rules_allow(
        proxied_pool: SlotPool, world: World, internet: InternetPeer, socks: str) -> None:
    """E2B ``egressProxy``: a slot's TCP, any port, leaves through the SOCKS5 upstream (the
    server sees the proxy, not the node); the address rules still decide first; a name rule
    and a header rule keep working through it; the proxy gone (or the password wrong) means
    no connection, never a direct one."""
    proxied_pool.proxy.reveal = _secret_api
    upstream = {"address": socks, "username": "agent", "password": "pässwort"}
    direct = await proxied_pool.acquire(_policy())
    tunnelled = await proxied_pool.acquire(policy_from(None, {
        "egressProxy": upstream, "denyOut": [world.b_ip],
        "allowOut": ["allowed.test"],
        "rules": {"allowed.test": [{"transform": {"headers": {
            "X-Api-Key": "${e2b.secrets.api}"}}}]}}, team_id="team-1"))
    echo = ["echo", internet.ip, str(ECHO_PORT)]
    straight, through = await asyncio.gather(
        _guest(direct, [echo]), _guest(tunnelled, [
            echo, ["echo", internet.private_ip, str(ECHO_PORT)],
            ["http", world.a_ip, "allowed.test"], ["http", world.b_ip, "denied.test"]]))
    seen_direct = str(straight[0]["greeting"]).split()[1].split(":")[0]
    seen_tunnel = str(through[0]["greeting"]).split()[1].split(":")[0]
    assert seen_direct == internet.host_ip, straight  # the node's side of the peer link
    assert seen_tunnel == internet.ip, through        # the proxy's own address
    assert through[1] == {"error": "closed"}, through  # an internal range: not tunnelled
    assert through[2] == {"status": 200,
                          "body": f"A allowed.test key={key_digest('s3cr3t')}"}, through
    assert through[3]["status"] == 403, through  # denied by address, over HTTP
    # A wrong password, then no proxy at all: nothing gets out, and nothing goes direct.
    for wrong in ({**upstream, "password": "nope"},
                  {"address": f"{internet.ip}:1081"}):
        await proxied_pool.set_egress(tunnelled, policy_from(None, {"egressProxy": wrong}))
        refused = await _guest(tunnelled, [echo])
        assert refused == [{"error": "closed"}] or "error" in refused[0], refused
    # Tunnelling off: straight out again, on the same slot.
    await proxied_pool.set_egress(tunnelled, _policy())
    again = await _guest(tunnelled, [echo])
    assert str(again[0]["greeting"]).split()[1].startswith(internet.host_ip + ":"), again


def test_policies_parse_names_and_refuse_nonsense() -> None:
    policy = _policy(allowOut=["API.Example.com.", "*.svc.test", "10.0.0.0/8"],
                     denyOut=["0.0.0.0/0", "bad.test"])
    assert policy.allow_domains == ("api.example.com", "*.svc.test")
    assert policy.allow_out == ("10.0.0.0/8",) and policy.deny_domains == ("bad.test",)
    assert policy.by_name and not _policy(allowOut=["1.2.3.4"]).by_name
    from aenv.core.errors import InvalidArgument
    for bad in (["-x.test"], ["a..b"], ["*"], ["under_score.test"], ["x" * 300]):
        with pytest.raises(InvalidArgument):
            _policy(allowOut=bad)
    for rules in ({"1.2.3.4": []}, {"a.test": [{"transform": {"headers": {"X": "a\nb"}}}]},
                  {"a.test": [{"transform": {"headers": {
                      "X": "${e2b.identity.tokens.aws}"}}}]}):
        with pytest.raises(InvalidArgument):
            _policy(rules=rules)
    with pytest.raises(InvalidArgument, match="egressProxy"):
        _policy(egressProxy={"address": "proxy.test"})  # no port
    assert _policy(egressProxy={"address": "proxy.test:1080"}).egress_proxy is not None
