"""The SOCKS5 upstream (network/socks_upstream.py): E2B's ``network.egressProxy`` body accepted
and refused field by field, and connections through real SOCKS5 servers on 127.0.0.1 —
Debian's ``danted`` (no authentication) and ``microsocks`` (username and password), with a
small TLS terminator of Python's own in front for TLS to the proxy.

Both come from scripts/install-system-deps.sh; with neither installed the proxy tests skip, with
one of them a test that needs the other fails and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.core.errors import InvalidArgument
from aenv.network.socks_upstream import (
    ProxyTls,
    SocksAuthError,
    SocksError,
    SocksProtocolError,
    SocksReplyError,
    SocksTimeout,
    SocksTlsError,
    SocksUnreachable,
    SocksUpstream,
    _connect_request,
    open_via,
)
from tests.certs import issue
from tests.conftest import free_port

DANTED = shutil.which("danted") or shutil.which("danted", path="/usr/sbin:/sbin")
MICROSOCKS = shutil.which("microsocks")
NO_SERVER = "neither danted (dante-server) nor microsocks is installed (make deps installs them)"
START_TIMEOUT_S = 10.0
TIMEOUT_S = 5.0
USER, PASSWORD = "üser", "pässwörd 1"  # non-ASCII: RFC 1929 counts bytes, E2B allows UTF-8
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

pytestmark = pytest.mark.anyio
_Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# --- parse ----------------------------------------------------------------------------------

def test_parse_the_address_forms() -> None:
    assert SocksUpstream.parse({"address": "proxy.example.com:1080"}) == SocksUpstream(
        host="proxy.example.com", port=1080)
    assert SocksUpstream.parse({"address": "10.1.2.3:1"}).host == "10.1.2.3"
    v6 = SocksUpstream.parse({"address": "[2001:DB8::1]:65535"})
    assert (v6.host, v6.port, v6.address) == ("2001:db8::1", 65535, "[2001:db8::1]:65535")
    assert SocksUpstream.parse({"address": "proxy_1.internal.:1080"}).host == "proxy_1.internal."


def test_parse_credentials_tls_and_unknown_keys(ca: Ca) -> None:
    upstream = SocksUpstream.parse({
        "address": "p.test:1080", "username": USER, "password": PASSWORD, "color": "blue",
        "tls": {"enabled": True, "serverName": "socks.test", "caCert": ca.pem, "x": 1}})
    assert (upstream.username, upstream.password) == (USER, PASSWORD)
    assert upstream.tls == ProxyTls(server_name="socks.test", ca_cert=ca.pem)
    # A username alone (an empty password is sent); nulls as absent; TLS off.
    alone = SocksUpstream.parse({"address": "p.test:1", "username": "u", "password": None,
                                 "tls": {"enabled": False}})
    assert (alone.username, alone.password, alone.tls) == ("u", None, None)
    assert SocksUpstream.parse({"address": "p.test:1", "username": None, "tls": None}) == \
        SocksUpstream(host="p.test", port=1)
    assert SocksUpstream.parse({"address": "p.test:1", "tls": {"enabled": True}}).tls == \
        ProxyTls()
    longest = "é" * 127 + "a"  # 255 bytes
    assert SocksUpstream.parse({"address": "p:1", "username": longest,
                                "password": longest}).password == longest


def test_as_json_hides_the_secrets_unless_asked_and_round_trips(ca: Ca) -> None:
    body = {"address": "[::1]:1080", "username": USER, "password": PASSWORD,
            "tls": {"enabled": True, "serverName": "socks.test", "caCert": ca.pem}}
    upstream = SocksUpstream.parse(body)
    assert upstream.as_json(with_secrets=True) == body
    assert SocksUpstream.parse(upstream.as_json(with_secrets=True)) == upstream
    assert upstream.as_json() == {"address": "[::1]:1080", "username": USER,
                                  "tls": {"enabled": True, "serverName": "socks.test"}}
    assert SocksUpstream.parse({"address": "p:1"}).as_json() == {"address": "p:1"}
    shown = repr(upstream) + str(upstream)
    assert PASSWORD not in shown and "BEGIN CERTIFICATE" not in shown and "password=***" in shown


@pytest.mark.parametrize(("body", "field"), [
    (None, "egressProxy must be an object"),
    ("p:1080", "egressProxy must be an object"),
    ({}, r"egressProxy\.address must be"),
    ({"address": 1080}, r"egressProxy\.address must be"),
    ({"address": ""}, r"egressProxy\.address must be"),
    ({"address": "proxy"}, r"egressProxy\.address 'proxy' is not 'host:port'"),
    ({"address": ":1080"}, r"egressProxy\.address ':1080' is not 'host:port'"),
    ({"address": "p:0"}, "the port must be 1 to 65535"),
    ({"address": "p:65536"}, "the port must be 1 to 65535"),
    ({"address": "p:http"}, "the port must be 1 to 65535"),
    ({"address": "p:+80"}, "the port must be 1 to 65535"),
    ({"address": "p:"}, "the port must be 1 to 65535"),
    ({"address": "2001:db8::1:1080"}, "an IPv6 address goes in brackets"),
    ({"address": "[10.0.0.1]:1080"}, "is not an IPv6 address"),
    ({"address": "pro xy:1080"}, "is not a host name"),
    ({"address": "-p.test:1080"}, "is not a host name"),
    ({"address": "a..b:1080"}, "is not a host name"),
    ({"address": "300.1.1.1:1080"}, "is not a host name"),
    ({"address": "prøxy.test:1080"}, "is not a host name"),
    ({"address": "p:1", "username": 7}, r"egressProxy\.username must be a string"),
    ({"address": "p:1", "username": ""}, r"egressProxy\.username must not be empty"),
    ({"address": "p:1", "username": "é" * 128}, r"egressProxy\.username is 256 bytes"),
    ({"address": "p:1", "username": "u", "password": "x" * 256},
     r"egressProxy\.password is 256 bytes"),
    ({"address": "p:1", "username": "u", "password": ["x"]},
     r"egressProxy\.password must be a string"),
    ({"address": "p:1", "password": "x"}, r"egressProxy\.password is only valid together"),
    ({"address": "p:1", "tls": True}, r"egressProxy\.tls must be an object"),
    ({"address": "p:1", "tls": {}}, r"egressProxy\.tls\.enabled must be true or false"),
    ({"address": "p:1", "tls": {"enabled": "yes"}}, r"tls\.enabled must be true or false"),
    ({"address": "p:1", "tls": {"enabled": False, "serverName": "s.test"}},
     r"egressProxy\.tls: with 'enabled': false, no other field"),
    ({"address": "p:1", "tls": {"enabled": False, "caCert": PEM}}, "no other field"),
    ({"address": "p:1", "tls": {"enabled": True, "serverName": "bad name"}},
     r"egressProxy\.tls\.serverName must be a host name"),
    ({"address": "p:1", "tls": {"enabled": True, "serverName": "a" * 254}},
     r"tls\.serverName must be a host name"),
    ({"address": "p:1", "tls": {"enabled": True, "serverName": 5}}, r"tls\.serverName"),
    ({"address": "p:1", "tls": {"enabled": True, "caCert": "not pem"}},
     r"egressProxy\.tls\.caCert must be one or more PEM certificates"),
    ({"address": "p:1", "tls": {"enabled": True, "caCert": PEM}},
     r"egressProxy\.tls\.caCert is not a valid PEM certificate"),
    ({"address": "p:1", "tls": {"enabled": True, "caCert": PEM + "x" * 8192}},
     r"egressProxy\.tls\.caCert is larger than 8192 bytes"),
])
def test_parse_refuses(body: object, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        SocksUpstream.parse(body)


def test_the_connect_request_sends_an_address_as_itself_and_a_name_as_a_name() -> None:
    assert _connect_request("10.1.2.3", 443) == bytes([5, 1, 0, 1, 10, 1, 2, 3, 1, 187])
    assert _connect_request("api.example.com", 80) == \
        bytes([5, 1, 0, 3, 15]) + b"api.example.com" + bytes([0, 80])
    assert _connect_request("::1", 1)[:4] == bytes([5, 1, 0, 4]) and \
        len(_connect_request("::1", 1)) == 4 + 16 + 2
    with pytest.raises(SocksError, match="too long"):
        _connect_request("a" * 256, 80)
    with pytest.raises(SocksError, match="not a name SOCKS5 can carry"):
        _connect_request("ü" * 70 + ".test", 80)


# --- real SOCKS5 servers --------------------------------------------------------------------

@dataclass
class Server:
    """A SOCKS5 server process on 127.0.0.1; stopped with its process group."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            # danted forks helpers into the group it leads (start_new_session).
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _start(argv: list[str], port: int, log_path: Path) -> Server:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(port, process, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return server
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"{argv[0]} did not start:\n{server.log()}")
        time.sleep(0.05)


def _need(binary: str | None, package: str) -> str:
    if DANTED is None and MICROSOCKS is None:
        pytest.skip(NO_SERVER)
    assert binary is not None, f"{package} is not installed (make deps installs it)"
    return binary


@contextlib.contextmanager
def _running(kind: str, directory: Path, *, auth: bool = False) -> Iterator[Server]:
    port = free_port()
    if kind == "dante":
        conf = directory / f"danted-{port}.conf"
        privileged = ("user.privileged: root\nuser.unprivileged: nobody\n"
                      if os.geteuid() == 0 else "")
        conf.write_text(
            f"logoutput: stderr\ninternal: 127.0.0.1 port = {port}\nexternal: 127.0.0.1\n"
            f"clientmethod: none\nsocksmethod: none\n{privileged}"
            "client pass { from: 127.0.0.0/8 to: 0.0.0.0/0 }\n"
            "socks pass { from: 127.0.0.0/8 to: 0.0.0.0/0 command: connect }\n")
        argv = [_need(DANTED, "dante-server"), "-f", str(conf), "-N", "1",
                "-p", str(directory / f"danted-{port}.pid")]
    else:
        argv = [_need(MICROSOCKS, "microsocks"), "-i", "127.0.0.1", "-p", str(port)]
        if auth:
            argv += ["-u", USER, "-P", PASSWORD]
    server = _start(argv, port, directory / f"{kind}-{port}.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Started on first use, stopped after the module."""
    if DANTED is None and MICROSOCKS is None:
        pytest.skip(NO_SERVER)
    directory = tmp_path_factory.mktemp("socks")
    with contextlib.ExitStack() as stack:

        class Lazy(dict[str, Server]):
            """``"dante"``, ``"microsocks"``, ``"microsocks+auth"`` (USER and PASSWORD)."""

            def __missing__(self, key: str) -> Server:
                kind, _, auth = key.partition("+")
                self[key] = stack.enter_context(_running(kind, directory, auth=auth == "auth"))
                return self[key]

        yield Lazy()


@contextlib.asynccontextmanager
async def _listening(handle: _Handler, context: ssl.SSLContext | None = None,
                     ) -> AsyncIterator[int]:
    """A server on 127.0.0.1 running ``handle`` per connection; yields its port."""
    writers: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(tracked, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


GREETING = b"target here\n"


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(GREETING)  # the target speaks first: its bytes reach the client unasked
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        assert await asyncio.wait_for(reader.readexactly(len(GREETING)), TIMEOUT_S) == GREETING
        payload = os.urandom(300_000)
        writer.write(payload)
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(len(payload)), TIMEOUT_S) == payload
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.mark.parametrize("kind", ["dante", "microsocks"])
async def test_bytes_both_ways_through_the_proxy(servers: dict[str, Server], kind: str) -> None:
    upstream = SocksUpstream(host="127.0.0.1", port=servers[kind].port)
    async with _listening(_echo) as target:
        await _round_trip(*await open_via(upstream, "127.0.0.1", target, timeout_s=TIMEOUT_S))


async def test_a_name_is_resolved_by_the_proxy(servers: dict[str, Server]) -> None:
    upstream = SocksUpstream(host="localhost", port=servers["dante"].port)  # the proxy by name
    async with _listening(_echo) as target:
        await _round_trip(*await open_via(upstream, "localhost", target, timeout_s=TIMEOUT_S))


@pytest.mark.parametrize("kind", ["dante", "microsocks"])
async def test_a_refused_target_is_the_proxys_reply(servers: dict[str, Server],
                                                    kind: str) -> None:
    upstream = SocksUpstream(host="127.0.0.1", port=servers[kind].port)
    closed = free_port()
    with pytest.raises(SocksReplyError, match=r"connection refused.*\(reply 5\)") as caught:
        await open_via(upstream, "127.0.0.1", closed, timeout_s=TIMEOUT_S)
    assert caught.value.reply == 5 and caught.value.errno == errno.ECONNREFUSED
    assert f"127.0.0.1:{closed}" in str(caught.value)


async def test_username_and_password(servers: dict[str, Server]) -> None:
    port = servers["microsocks+auth"].port
    good = SocksUpstream(host="127.0.0.1", port=port, username=USER, password=PASSWORD)
    async with _listening(_echo) as target:
        await _round_trip(*await open_via(good, "127.0.0.1", target, timeout_s=TIMEOUT_S))
        wrong = SocksUpstream(host="127.0.0.1", port=port, username=USER, password="wrong")
        with pytest.raises(SocksAuthError, match="refused the username and password"):
            await open_via(wrong, "127.0.0.1", target, timeout_s=TIMEOUT_S)
        with pytest.raises(SocksAuthError, match=r"accepts none of the offered authentication "
                                                 r"methods \(none\)"):
            await open_via(SocksUpstream(host="127.0.0.1", port=port), "127.0.0.1", target,
                           timeout_s=TIMEOUT_S)


async def test_a_proxy_that_is_down_or_silent_fails_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(SocksUnreachable, match="cannot connect to the SOCKS5 proxy") as caught:
        await open_via(SocksUpstream(host="127.0.0.1", port=free_port()), "127.0.0.1", 80,
                       timeout_s=TIMEOUT_S)
    assert caught.value.errno == errno.ECONNREFUSED and time.monotonic() - started < 1

    async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        await reader.read()

    async with _listening(silent) as port:
        started = time.monotonic()
        with pytest.raises(SocksTimeout, match=r"within 0\.5s \(in the SOCKS5 handshake\)"):
            await open_via(SocksUpstream(host="127.0.0.1", port=port), "127.0.0.1", 80,
                           timeout_s=0.5)
        assert 0.45 <= time.monotonic() - started < 2

        # A cancellation stays a cancellation.
        task = asyncio.ensure_future(open_via(SocksUpstream(host="127.0.0.1", port=port),
                                              "127.0.0.1", 80, timeout_s=TIMEOUT_S))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_server_that_is_not_socks5() -> None:
    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(3)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(3)

    async with _listening(http) as port:
        with pytest.raises(SocksProtocolError, match="does not speak SOCKS5"):
            await open_via(SocksUpstream(host="127.0.0.1", port=port), "127.0.0.1", 80,
                           timeout_s=TIMEOUT_S)
    async with _listening(hangs_up) as port:
        with pytest.raises(SocksProtocolError, match="closed the connection"):
            await open_via(SocksUpstream(host="127.0.0.1", port=port), "127.0.0.1", 80,
                           timeout_s=TIMEOUT_S)


# --- TLS to the proxy: a terminator of Python's own in front of the real server -------------

@dataclass(frozen=True)
class Ca:
    pem: str
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Ca:
    """A CA and a certificate it signed for ``socks.test`` (only: not for 127.0.0.1)."""
    cert, key, ca = issue(tmp_path_factory.mktemp("socks-ca"), ["socks.test"],
                          ca_name="socks test CA")
    return Ca(ca.read_text(), cert, key)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()


@contextlib.asynccontextmanager
async def _tls_front(port: int, ca: Ca) -> AsyncIterator[int]:
    """TLS on a port of its own, the plaintext relayed to the SOCKS server at ``port``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.cert, ca.key)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.transport.abort()

    async with _listening(relay, context) as tls_port:
        yield tls_port


async def test_tls_to_the_proxy_carries_the_credentials(servers: dict[str, Server],
                                                        ca: Ca) -> None:
    async with _tls_front(servers["microsocks+auth"].port, ca) as port, \
            _listening(_echo) as target:
        upstream = SocksUpstream(host="127.0.0.1", port=port, username=USER, password=PASSWORD,
                                 tls=ProxyTls(server_name="socks.test", ca_cert=ca.pem))
        await _round_trip(*await open_via(upstream, "127.0.0.1", target, timeout_s=TIMEOUT_S))

        # The caller's own context (here: trusting the CA) instead of caCert's.
        trusting = ssl.create_default_context(cadata=ca.pem)
        bare = SocksUpstream(host="127.0.0.1", port=port, username=USER, password=PASSWORD,
                             tls=ProxyTls(server_name="socks.test"))
        await _round_trip(*await open_via(bare, "127.0.0.1", target, timeout_s=TIMEOUT_S,
                                          ssl_context_for_proxy=trusting))


async def test_tls_to_the_proxy_verifies_its_certificate(servers: dict[str, Server],
                                                         ca: Ca) -> None:
    async with _tls_front(servers["microsocks+auth"].port, ca) as port:
        # The certificate names socks.test, not the address it is reached at.
        no_name = SocksUpstream(host="127.0.0.1", port=port,
                                tls=ProxyTls(ca_cert=ca.pem))
        with pytest.raises(SocksTlsError, match=r"TLS to the SOCKS5 proxy 127\.0\.0\.1:\d+ failed"):
            await open_via(no_name, "127.0.0.1", 80, timeout_s=TIMEOUT_S)
        # The system's trust store does not know the test CA.
        system = SocksUpstream(host="127.0.0.1", port=port,
                               tls=ProxyTls(server_name="socks.test"))
        with pytest.raises(SocksTlsError, match="certificate"):
            await open_via(system, "127.0.0.1", 80, timeout_s=TIMEOUT_S)
