"""Traffic through slots, with Linux's own stack as the guest (no gVisor: fast, and it shows
the nft design works on its own). tests/runtime repeats the important cases through runsc."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
import time

import httpx
import pytest

from aenv.core.net import EgressPolicy, NetSlot
from aenv.network import guest_http
from aenv.network.pool import SlotPool
from tests.network.fixtures import pool_config, shut
from tests.network.peers import (
    ECHO_PORT,
    HOLD,
    HTTP_SERVER,
    PROBE,
    HostListener,
    InternetPeer,
    LanPeer,
    host_primary_ip,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]

#: Blocked traffic is dropped, so a probe waits this long before calling it blocked.
PROBE_TIMEOUT_S = 1.5


async def in_netns(slot: NetSlot, code: str, *args: str, timeout: float = 30) -> str:
    """Run a Python snippet in the slot's netns (as its guest would) and return its stdout."""
    child = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/run/netns/{slot.netns}", "--", sys.executable, "-c", code, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout)
    assert child.returncode == 0, err.decode()
    return out.decode()


async def probe(slot: NetSlot, *targets: str) -> dict[str, str]:
    out = await in_netns(slot, PROBE, str(PROBE_TIMEOUT_S), *targets)
    result: dict[str, str] = json.loads(out)
    return result


async def test_the_host_reaches_each_guest_through_its_veth(pool: SlotPool) -> None:
    a, b = await pool.acquire(), await pool.acquire()
    servers = [
        await asyncio.create_subprocess_exec(
            "nsenter", f"--net=/run/netns/{s.netns}", "--", sys.executable, "-c", HTTP_SERVER,
            "8080", s.netns
        )
        for s in (a, b)
    ]
    try:
        for slot in (a, b):
            await guest_http.wait_http(slot, 8080, "/", timeout=10, expect=200)
        connector = guest_http.GuestConnector()
        for slot in (a, b):
            async with httpx.AsyncClient(
                transport=connector.transport(slot), base_url=f"http://{slot.guest_ip}:8080"
            ) as client:
                assert (await client.get("/")).text == slot.netns
        # The same 4-tuple towards both guests at once: only conntrack zones keep them apart.
        socks = []
        for slot in (a, b):
            sock = guest_http.bound_socket(slot)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((slot.gateway_ip, 45_123))
            await asyncio.get_running_loop().sock_connect(sock, (slot.guest_ip, 8080))
            socks.append(sock)
        for sock, slot in zip(socks, (a, b), strict=True):
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            assert (await reader.read()).endswith(slot.netns.encode())
            writer.close()
        await connector.aclose()
    finally:
        for server in servers:
            server.kill()
            await server.wait()


async def test_two_guests_hold_the_same_connection_tuple_at_once(
    pool: SlotPool, internet: InternetPeer
) -> None:
    a, b = await pool.acquire(), await pool.acquire()
    outs = await asyncio.gather(
        *(in_netns(s, HOLD, "40000", internet.ip, str(ECHO_PORT), "1.0", s.netns) for s in (a, b))
    )
    results = [json.loads(out) for out in outs]
    for result, slot in zip(results, (a, b), strict=True):
        assert result["greeting"].startswith(f"peer {internet.host_ip}:")  # masqueraded
        assert result["echo"] == f"echo {slot.netns}"
    assert results[0]["greeting"] != results[1]["greeting"]  # NAT gave them different ports


async def test_a_guest_reaches_neither_the_host_nor_another_guest(
    pool: SlotPool, internet: InternetPeer
) -> None:
    a, b = await pool.acquire(), await pool.acquire()
    listener = HostListener()
    try:
        port = listener.port
        result = await probe(
            a,
            f"{a.gateway_ip}:{port}",
            f"{host_primary_ip()}:{port}",
            f"{internet.host_ip}:{port}",
            f"{pool.return_ip(b)}:{port}",
            f"{pool.return_ip(a)}:{port}",
            f"{internet.ip}:{ECHO_PORT}",
        )
        assert result.pop(f"{internet.ip}:{ECHO_PORT}") == "connected"
        assert set(result.values()) == {"timeout"}, result
        assert listener.accepted() == 0
    finally:
        listener.close()


async def test_internal_ranges_follow_the_policy_at_run_time(
    pool: SlotPool, internet: InternetPeer
) -> None:
    slot = await pool.acquire()
    private, public = f"{internet.private_ip}:{ECHO_PORT}", f"{internet.ip}:{ECHO_PORT}"
    assert await probe(slot, private, public) == {private: "timeout", public: "connected"}
    await pool.set_egress(slot, EgressPolicy(allow_out=(internet.private_ip,)))
    assert await probe(slot, private, public) == {private: "connected", public: "connected"}
    await pool.set_egress(slot, EgressPolicy(allow_internet=False,
                                             allow_out=(internet.private_ip,)))
    assert await probe(slot, private, public) == {private: "connected", public: "timeout"}
    await pool.set_egress(slot, EgressPolicy(deny_out=(internet.ip,)))
    assert await probe(slot, public) == {public: "timeout"}


async def test_the_node_networks_are_unreachable_whatever_the_policy(
    lan: LanPeer, internet: InternetPeer, pool: SlotPool
) -> None:
    """Issue 21 item 9: the node's LAN (in no fixed range), the host's address on it and the
    node's gateways are dropped before the slot's policy is looked at; the internet behind the
    gateway stays open."""
    slot = await pool.acquire()
    listener = HostListener()
    lan_server, public = f"{lan.ip}:{ECHO_PORT}", f"{internet.ip}:{ECHO_PORT}"
    lan_host = f"{lan.host_ip}:{listener.port}"
    # The internet's router runs the echo server too: only the node's rule stands in the way.
    router = f"{internet.router_ip}:{ECHO_PORT}"
    try:
        for policy in (
            EgressPolicy(),
            EgressPolicy(allow_out=(lan.subnet, internet.router_ip, lan.host_ip)),
            EgressPolicy(allow_out=("0.0.0.0/0",)),
            EgressPolicy(allow_internet=False, allow_out=(lan.subnet, internet.ip)),
        ):
            await pool.set_egress(slot, policy)
            result = await probe(slot, lan_server, lan_host, router, public)
            assert result == {
                lan_server: "timeout", lan_host: "timeout", router: "timeout",
                public: "connected",
            }, policy
        assert listener.accepted() == 0
    finally:
        listener.close()


async def test_a_network_that_comes_up_later_is_denied_within_the_refresh() -> None:
    pool = SlotPool(pool_config(node_nets_refresh_s=0.2))
    await pool.start()
    late = LanPeer(tag=(LanPeer().tag + 16) % 32)
    try:
        slot = await pool.acquire()
        late.start()
        started = time.monotonic()
        target = f"{late.ip}:{ECHO_PORT}"
        while (await probe(slot, target))[target] == "connected":
            assert time.monotonic() - started < 5, "the new LAN stayed reachable"
        late.stop()
        gone = await pool.refresh_node_nets()
        assert not any(ipaddress.ip_address(late.ip) in net for net in gone)
    finally:
        late.stop()
        await shut(pool)
