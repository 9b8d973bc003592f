"""A sandbox's SOCKS5 upstream (E2B's ``network.egressProxy``): its parsed form, and one TCP
connection tunnelled through it.

E2B's body, as the SDK defines it (``SandboxEgressProxyConfig``)::

    {"address": "host:port",                   # a name, an IPv4 literal or [an IPv6 literal]
     "username": "...", "password": "...",     # RFC 1929, each at most 255 bytes of UTF-8;
                                               # a password only together with a username
     "tls": {"enabled": true,                  # TLS to the proxy; when false, nothing else
             "serverName": "...",              # what to verify the proxy's certificate
                                               # against and send as SNI (default: the host)
             "caCert": "PEM..."}}              # replaces the system trust store (≤ 8192 bytes)

Unknown keys are ignored, a ``null`` field is as good as an absent one. The proxy's address is
not judged here (reachable, internal or not): that is the node's policy, and it needs DNS.

:func:`open_via` opens one upstream connection: TCP (TLS 1.2 or newer when ``tls`` is on, the
certificate always verified, never a plaintext fallback) to the proxy, the SOCKS5 handshake
(RFC 1928: no authentication, or RFC 1929's username and password), ``CONNECT`` to the target
— an IP literal as itself (ATYP 1 or 4), a name as a name (ATYP 3: the proxy resolves it) — and
the stream pair that carries the tunnelled bytes. Failures are :class:`SocksError`, an
``OSError``, so a caller that handles a failed direct connect handles these the same::

    OSError
    └── SocksError              the upstream could not be opened
        ├── SocksUnreachable    no TCP connection to the proxy (refused, unreachable, reset)
        │   └── SocksTlsError   the TLS handshake with the proxy failed (its certificate ...)
        ├── SocksTimeout        a step had no answer in time (also a ``TimeoutError``)
        ├── SocksProtocolError  the proxy does not speak SOCKS5, or hung up mid-handshake
        ├── SocksAuthError      no method both sides accept, or the credentials refused
        └── SocksReplyError     the proxy refused the CONNECT: ``.reply`` is RFC 1928's code

Hand-written rather than python-socks (the one well-kept asyncio client): its RFC 1929 request
counts characters and encodes ASCII (E2B allows 255 *bytes* of UTF-8), it offers username and
password only when both are non-empty, it sends the proxy's host as SNI with no way to name
another (E2B's ``serverName``), and it tells an auth failure from a refused CONNECT only by
its message. The protocol is a few fixed-size messages; asyncio's streams do the rest.

Owns: nothing that outlives a call. Must not touch: the egress proxy's listeners, nft.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import re
import ssl
from dataclasses import dataclass
from typing import Any

from aenv.core.errors import InvalidArgument

_FIELD = "network.egressProxy"
#: RFC 1929's ULEN and PLEN are one byte each.
MAX_CREDENTIAL = 255
#: The SDK's limits for ``tls.serverName`` (a DNS name) and ``tls.caCert``.
MAX_SERVER_NAME = 253
MAX_CA_CERT = 8192
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_PEM_CERT = "-----BEGIN CERTIFICATE-----"

_VERSION = 5
_NO_AUTH, _USER_PASS, _NO_METHOD = 0x00, 0x02, 0xFF
_CONNECT = 1
_IPV4, _NAME, _IPV6 = 1, 3, 4
#: RFC 1928's replies, and the errno a direct connect would have failed with.
REPLIES: dict[int, tuple[str, int]] = {
    1: ("general SOCKS server failure", errno.EIO),
    2: ("connection not allowed by the proxy's ruleset", errno.EACCES),
    3: ("network unreachable", errno.ENETUNREACH),
    4: ("host unreachable", errno.EHOSTUNREACH),
    5: ("connection refused", errno.ECONNREFUSED),
    6: ("TTL expired", errno.ETIMEDOUT),
    7: ("command not supported", errno.EOPNOTSUPP),
    8: ("address type not supported", errno.EAFNOSUPPORT),
}


class SocksError(OSError):
    """The upstream connection through the SOCKS5 proxy could not be opened."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        # Only errno, not strerror: str() stays the message.
        self.errno = code


class SocksUnreachable(SocksError):
    """No TCP connection to the proxy."""


class SocksTlsError(SocksUnreachable):
    """The TLS handshake with the proxy failed (certificate not valid for the name ...)."""


class SocksTimeout(SocksError, TimeoutError):
    """A step (connect, handshake, the CONNECT's reply) had no answer within the timeout."""


class SocksProtocolError(SocksError):
    """The proxy does not speak SOCKS5, or closed the connection during the handshake."""


class SocksAuthError(SocksError):
    """No authentication method both sides accept, or the proxy refused the credentials."""


class SocksReplyError(SocksError):
    """The proxy answered the CONNECT with a failure; ``reply`` is RFC 1928's code."""

    def __init__(self, message: str, *, reply: int) -> None:
        super().__init__(message, code=REPLIES.get(reply, ("", errno.EIO))[1])
        self.reply = reply


@dataclass(frozen=True, repr=False)
class ProxyTls:
    """TLS to the proxy (E2B's ``tls`` with ``enabled: true``)."""

    #: What the proxy's certificate is verified against and the SNI sent (None: its host).
    server_name: str | None = None
    #: PEM certificates that replace the system trust store (None: the system's).
    ca_cert: str | None = None

    def __repr__(self) -> str:
        ca = "system" if self.ca_cert is None else f"<{len(self.ca_cert)} bytes of PEM>"
        return f"ProxyTls(server_name={self.server_name!r}, ca_cert={ca})"

    def context(self) -> ssl.SSLContext:
        """The client context: verifies the certificate and the name, TLS 1.2 or newer
        (shared by every connection with the same ``ca_cert``)."""
        return _client_context(self.ca_cert)


@dataclass(frozen=True, repr=False)
class SocksUpstream:
    """A parsed ``network.egressProxy``. Its repr never shows the password."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    #: None: plain TCP to the proxy.
    tls: ProxyTls | None = None

    @property
    def address(self) -> str:
        """``host:port`` as E2B writes it (an IPv6 literal in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __repr__(self) -> str:
        secret = None if self.password is None else "***"
        return (f"SocksUpstream(address={self.address!r}, username={self.username!r}, "
                f"password={secret}, tls={self.tls!r})")

    @classmethod
    def parse(cls, value: object) -> SocksUpstream:
        """E2B's ``network.egressProxy`` body (not None: the caller decides that no proxy is
        wanted). Raises :class:`InvalidArgument` naming the field at fault."""
        if not isinstance(value, dict):
            raise InvalidArgument(f"{_FIELD} must be an object with an 'address'")
        host, port = _address(value.get("address"))
        username = _credential(value.get("username"), "username")
        password = _credential(value.get("password"), "password")
        if password is not None and username is None:
            raise InvalidArgument(f"{_FIELD}.password is only valid together with a username")
        return cls(host=host, port=port, username=username, password=password,
                   tls=_tls(value.get("tls")))

    def as_json(self, *, with_secrets: bool = False) -> dict[str, Any]:
        """The E2B shape. By default what E2B's API returns of it (no password, no
        ``caCert``); ``with_secrets``: everything, which :meth:`parse` reads back the same."""
        out: dict[str, Any] = {"address": self.address}
        if self.username is not None:
            out["username"] = self.username
        if with_secrets and self.password is not None:
            out["password"] = self.password
        if self.tls is not None:
            tls: dict[str, Any] = {"enabled": True}
            if self.tls.server_name is not None:
                tls["serverName"] = self.tls.server_name
            if with_secrets and self.tls.ca_cert is not None:
                tls["caCert"] = self.tls.ca_cert
            out["tls"] = tls
        return out


def _address(value: object) -> tuple[str, int]:
    where = f"{_FIELD}.address"
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{where} must be a 'host:port' string")
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"{where} {value!r} is not 'host:port'")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise InvalidArgument(f"{where} {value!r}: the port must be 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port_text)
        except ValueError:
            raise InvalidArgument(f"{where} {value!r}: {host} is not an IPv6 address") from None
    if ":" in host:
        raise InvalidArgument(f"{where} {value!r}: an IPv6 address goes in brackets "
                              "('[2001:db8::1]:1080')")
    if not _is_host_name(host):
        raise InvalidArgument(f"{where} {value!r}: {host!r} is not a host name or an IP "
                              "address")
    return host, int(port_text)


def _is_host_name(text: str) -> bool:
    """A DNS name or an IPv4 literal (a name whose last label is all digits must be one)."""
    name = text.removesuffix(".")
    if not (0 < len(name) <= MAX_SERVER_NAME and name.isascii()
            and all(_LABEL.fullmatch(label) for label in name.split("."))):
        return False
    return not name.rpartition(".")[2].isdigit() or _is_ip(name)


def _credential(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{_FIELD}.{name} must be a string")
    size = len(value.encode())
    if name == "username" and size == 0:
        raise InvalidArgument(f"{_FIELD}.username must not be empty (omit it for a proxy "
                              "that takes no credentials)")
    if size > MAX_CREDENTIAL:
        raise InvalidArgument(f"{_FIELD}.{name} is {size} bytes of UTF-8; at most "
                              f"{MAX_CREDENTIAL}")
    return value


def _tls(value: object) -> ProxyTls | None:
    where = f"{_FIELD}.tls"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} must be an object ({{'enabled': true, ...}}) or null")
    enabled = value.get("enabled")
    if not isinstance(enabled, bool):
        raise InvalidArgument(f"{where}.enabled must be true or false")
    server_name, ca_cert = value.get("serverName"), value.get("caCert")
    if not enabled:
        if server_name is not None or ca_cert is not None:
            raise InvalidArgument(f"{where}: with 'enabled': false, no other field may be set")
        return None
    if server_name is not None and not (isinstance(server_name, str) and (
            _is_host_name(server_name) or _is_ip(server_name))):
        raise InvalidArgument(f"{where}.serverName must be a host name (at most "
                              f"{MAX_SERVER_NAME} characters) or an IP address")
    if ca_cert is not None:
        if not isinstance(ca_cert, str) or _PEM_CERT not in ca_cert:
            raise InvalidArgument(f"{where}.caCert must be one or more PEM certificates")
        if len(ca_cert.encode()) > MAX_CA_CERT:
            raise InvalidArgument(f"{where}.caCert is larger than {MAX_CA_CERT} bytes")
        try:
            _client_context(ca_cert)
        except (ssl.SSLError, ValueError) as exc:
            raise InvalidArgument(f"{where}.caCert is not a valid PEM certificate: "
                                  f"{exc}") from None
    return ProxyTls(server_name=server_name, ca_cert=ca_cert)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _client_context(ca_cert: str | None) -> ssl.SSLContext:
    # create_default_context loads the system store only when given no CA: caCert replaces it.
    context = ssl.create_default_context(cadata=ca_cert)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _connect_request(host: str, port: int) -> bytes:
    if _is_ip(host):
        ip = ipaddress.ip_address(host)
        address = bytes([_IPV4 if ip.version == 4 else _IPV6]) + ip.packed
    else:
        try:
            name = host.encode("ascii") if host.isascii() else host.encode("idna")
        except UnicodeError:
            raise SocksError(f"{host!r} is not a name SOCKS5 can carry") from None
        if not 0 < len(name) <= 255:
            raise SocksError(f"the name {host!r} is too long for SOCKS5")
        address = bytes([_NAME, len(name)]) + name
    return bytes([_VERSION, _CONNECT, 0]) + address + port.to_bytes(2, "big")


async def open_via(upstream: SocksUpstream, host: str, port: int, *, timeout_s: float,
                   ssl_context_for_proxy: ssl.SSLContext | None = None,
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to ``host:port`` tunnelled through ``upstream``.

    Prerequisites: ``host`` is what the node decided on — normally an IPv4 literal it
    resolved and judged (sent as ATYP 1); a name is sent as a name (ATYP 3) and resolved by
    the proxy. ``ssl_context_for_proxy`` replaces the context ``upstream.tls`` says (it is
    used only when ``upstream.tls`` is set).

    On success: the stream pair carries the target's bytes; the proxy's replies are consumed.
    Over TLS, ``writer.can_write_eof()`` is False: a half-close can only be a full close.

    On failure: a :class:`SocksError` subclass, with nothing left open. The whole open —
    connect, TLS, method negotiation, authentication and the CONNECT's reply — is bounded by
    ``timeout_s`` (:class:`SocksTimeout`). Cancellation is never turned into an error.
    """
    proxy = upstream.address
    tls = upstream.tls
    context = None if tls is None else (ssl_context_for_proxy or tls.context())
    step = "connecting"
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            try:
                reader, writer = await asyncio.open_connection(
                    upstream.host, upstream.port, ssl=context,
                    server_hostname=None if tls is None else (tls.server_name or upstream.host))
            except ssl.SSLError as exc:
                why = getattr(exc, "verify_message", None) or exc.reason or exc
                raise SocksTlsError(f"TLS to the SOCKS5 proxy {proxy} failed: {why}") from exc
            except OSError as exc:
                raise SocksUnreachable(f"cannot connect to the SOCKS5 proxy {proxy}: "
                                       f"{exc.strerror or exc}", code=exc.errno) from exc
            step = "in the SOCKS5 handshake"
            await _authenticate(reader, writer, upstream)
            step = "waiting for the CONNECT's reply"
            writer.write(_connect_request(host, port))
            await writer.drain()
            await _connect_reply(reader, proxy, host, port)
            return reader, writer
    except BaseException as exc:
        if writer is not None:
            writer.transport.abort()
        if isinstance(exc, SocksError) or not isinstance(exc, Exception):
            raise  # ours already, or a cancellation
        if isinstance(exc, TimeoutError):
            raise SocksTimeout(f"no answer from the SOCKS5 proxy {proxy} within "
                               f"{timeout_s:g}s ({step})", code=errno.ETIMEDOUT) from exc
        if isinstance(exc, asyncio.IncompleteReadError):
            raise SocksProtocolError(f"the SOCKS5 proxy {proxy} closed the connection "
                                     f"({step})") from exc
        if isinstance(exc, OSError):
            raise SocksError(f"the connection to the SOCKS5 proxy {proxy} failed ({step}): "
                             f"{exc.strerror or exc}", code=exc.errno) from exc
        raise


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        upstream: SocksUpstream) -> None:
    proxy = upstream.address
    # With credentials both methods are offered (as Go's x/net/proxy does): a proxy that
    # takes anyone may choose not to ask.
    methods = [_NO_AUTH] if upstream.username is None else [_NO_AUTH, _USER_PASS]
    writer.write(bytes([_VERSION, len(methods), *methods]))
    await writer.drain()
    version, method = await reader.readexactly(2)
    if version != _VERSION:
        raise SocksProtocolError(f"{proxy} does not speak SOCKS5 (it answered version "
                                 f"{version})")
    if method == _NO_AUTH:
        return
    if method == _USER_PASS and upstream.username is not None:
        user, password = upstream.username.encode(), (upstream.password or "").encode()
        writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        await writer.drain()
        _, status = await reader.readexactly(2)
        if status != 0:
            raise SocksAuthError(f"the SOCKS5 proxy {proxy} refused the username and "
                                 f"password (status {status})", code=errno.EACCES)
        return
    if method == _USER_PASS:
        raise SocksAuthError(f"the SOCKS5 proxy {proxy} asks for a username and password; "
                             f"{_FIELD} gives none", code=errno.EACCES)
    if method == _NO_METHOD:
        offered = "none" if upstream.username is None else "none or username/password"
        raise SocksAuthError(f"the SOCKS5 proxy {proxy} accepts none of the offered "
                             f"authentication methods ({offered})", code=errno.EACCES)
    raise SocksProtocolError(f"the SOCKS5 proxy {proxy} chose method {method}, which was "
                             "not offered")


async def _connect_reply(reader: asyncio.StreamReader, proxy: str, host: str,
                         port: int) -> None:
    version, reply, _, kind = await reader.readexactly(4)
    if version != _VERSION:
        raise SocksProtocolError(f"{proxy} answered CONNECT with SOCKS version {version}")
    if reply != 0:
        name = REPLIES.get(reply, ("unknown reply",))[0]
        raise SocksReplyError(f"{_target(host, port)} through the SOCKS5 proxy {proxy}: "
                              f"{name} (reply {reply})", reply=reply)
    if kind == _IPV4:
        await reader.readexactly(4 + 2)
    elif kind == _IPV6:
        await reader.readexactly(16 + 2)
    elif kind == _NAME:
        (size,) = await reader.readexactly(1)
        await reader.readexactly(size + 2)
    else:
        raise SocksProtocolError(f"the SOCKS5 proxy {proxy} answered CONNECT with address "
                                 f"type {kind}")


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
