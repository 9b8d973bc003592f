"""HTTPS interception for the egress rules' hosts (docs/security.md, "Secrets in requests").

A host that a sandbox's ``network.rules`` name gets its request headers set by the node, and
over HTTPS that means the node ends the guest's TLS: it answers the ClientHello with a
certificate for the SNI's name, signed by the platform's CA, which the sandbox trusts
(envd installs it, ``envd/trust_store.py``), and opens its own TLS to the real host,
verifying the host's certificate as any client would. Hosts without rules are never
intercepted: their bytes pass through untouched (``egress_proxy.py``).

The CA's key is derived from the operator key (HKDF-SHA256, as the secrets' key is), so every
node of a cluster — one operator key — issues certificates the same sandboxes trust, and a
sandbox moved to another node keeps working. Its certificate is made fresh per process, with
the same name and key: a verifier matches the issuer by name and checks the signature with
the key, so any node's copy is the same anchor.

Leaf certificates share one key made per process and are kept per host name (at most
``MAX_HOSTS``); ``ssl`` loads certificates only from files, so each is written once to the
interception's own directory (mode 0700) under a hash of its name.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_INFO = b"aenv egress ca v1"
#: secp256r1's group order: a derived scalar is reduced below it.
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
#: The CA's validity, fixed so that every node's copy of it says the same.
_CA_FROM = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
_CA_UNTIL = datetime.datetime(2045, 1, 1, tzinfo=datetime.UTC)
#: A leaf lives this long; the cache drops it a day before.
LEAF_DAYS = 30
MAX_HOSTS = 1024
#: The protocol spoken on both sides of an interception (the relay is HTTP/1.1).
ALPN = ["http/1.1"]


def _ca_key(seed: bytes) -> ec.EllipticCurvePrivateKey:
    derived = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=_INFO).derive(seed)
    scalar = int.from_bytes(derived, "big") % (_P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def _name(ca_key: ec.EllipticCurvePrivateKey) -> x509.Name:
    public = ca_key.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aenv"),
        x509.NameAttribute(NameOID.COMMON_NAME,
                           f"aenv egress CA {hashlib.sha256(public).hexdigest()[:12]}"),
    ])


@dataclass(frozen=True)
class _Leaf:
    context: ssl.SSLContext
    until: datetime.datetime


class Interception:
    """The CA, the leaf certificates made with it, and the context that checks upstreams."""

    def __init__(self, seed: bytes, directory: Path, *, upstream_cafile: Path | None = None,
                 ) -> None:
        self._ca_key = _ca_key(seed)
        self._ca_name = _name(self._ca_key)
        ski = x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key())
        self._ca = (
            x509.CertificateBuilder()
            .subject_name(self._ca_name).issuer_name(self._ca_name)
            .public_key(self._ca_key.public_key())
            .serial_number(int.from_bytes(ski.digest[:16], "big") >> 1)
            .not_valid_before(_CA_FROM).not_valid_after(_CA_UNTIL)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        #: The CA certificate the sandboxes trust (PEM).
        self.ca_pem = self._ca.public_bytes(serialization.Encoding.PEM).decode()
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
        self._dir = directory
        self._leaves: OrderedDict[str, _Leaf] = OrderedDict()
        self._minting: dict[str, asyncio.Future[_Leaf]] = {}
        #: How the node's side of an interception checks the real host (the host's own CAs,
        #: and ``upstream_cafile`` besides: a private API's CA).
        self.upstream = ssl.create_default_context()
        if upstream_cafile is not None:
            self.upstream.load_verify_locations(cafile=str(upstream_cafile))
        self.upstream.set_alpn_protocols(ALPN)

    def prepare(self) -> None:
        """Make the directory the leaves are written to (blocking; at start)."""
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        for stale in self._dir.glob("*.pem"):  # another process's leaves: another key
            stale.unlink(missing_ok=True)

    async def server_context(self, host: str) -> ssl.SSLContext:
        """The context that answers a ClientHello for ``host`` (a name, lower case)."""
        now = datetime.datetime.now(datetime.UTC)
        held = self._leaves.get(host)
        if held is not None and held.until > now:
            self._leaves.move_to_end(host)
            return held.context
        pending = self._minting.get(host)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._mint, host, now))
            self._minting[host] = pending
            pending.add_done_callback(lambda _: self._minting.pop(host, None))
        leaf = await asyncio.shield(pending)
        self._leaves[host] = leaf
        while len(self._leaves) > MAX_HOSTS:
            self._leaves.popitem(last=False)
        return leaf.context

    def _mint(self, host: str, now: datetime.datetime) -> _Leaf:
        until = now + datetime.timedelta(days=LEAF_DAYS)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._ca_name)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._ca_key.public_key()), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        path = self._dir / f"{hashlib.sha256(host.encode()).hexdigest()[:32]}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + self._leaf_key_pem)
        path.chmod(0o600)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(path))
        context.set_alpn_protocols(ALPN)
        return _Leaf(context, until - datetime.timedelta(days=1))


class GuestTls:
    """The node's end of a guest's TLS connection, over the guest's plain stream (``ssl``'s
    memory BIOs: the ClientHello was already read off the stream to find the SNI, so it is
    fed in first). Reads and writes as a stream pair does, for the HTTP relay."""

    def __init__(self, context: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, first: bytes, *, chunk: int = 64 << 10) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._incoming.write(first)
        self._reader = reader
        self._writer = writer
        self._chunk = chunk

    async def handshake(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    self._tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self._fill()
        self._flush()
        await self._writer.drain()

    async def _fill(self) -> bool:
        self._flush()
        await self._writer.drain()
        data = await self._reader.read(self._chunk)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    def _flush(self) -> None:
        if pending := self._outgoing.read():
            self._writer.write(pending)

    async def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of plaintext; b"" at the guest's close."""
        while True:
            try:
                return self._tls.read(size)
            except ssl.SSLWantReadError:
                if not await self._fill():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def write(self, data: bytes) -> None:
        self._tls.write(data)
        self._flush()

    async def drain(self) -> None:
        await self._writer.drain()
