"""The name a guest's connection asks for, from its first bytes: the HTTP request head's
``Host``, the TLS ClientHello's SNI (pure; network/egress_proxy.py decides on them)."""

from __future__ import annotations


def host_header(head: bytes) -> str | None:
    """The Host of an HTTP request head (without its port); None: none, or an IPv6 one."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == b"host":
            host = value.strip().decode("latin-1")
            if host.startswith("["):
                return None  # IPv6: sandboxes have none
            return host.rsplit(":", 1)[0] if ":" in host else host
    return None


def sni_of(record: bytes) -> str | None:
    """The server name of a TLS ClientHello handshake record's body, or None.

    Written by hand: the standard library parses no ClientHello, and the layout is fixed
    (RFC 8446 §4.1.2, RFC 6066 §3): handshake type and length, version, random, session id,
    cipher suites, compression methods, then the extensions, of which server_name (0) holds
    a list of (type 0: host_name, length, name).
    """
    try:
        if record[0] != 1:  # client_hello
            return None
        at = 4 + 2 + 32
        at += 1 + record[at]  # session id
        at += 2 + int.from_bytes(record[at:at + 2], "big")  # cipher suites
        at += 1 + record[at]  # compression methods
        end = at + 2 + int.from_bytes(record[at:at + 2], "big")
        at += 2
        while at + 4 <= end:
            kind = int.from_bytes(record[at:at + 2], "big")
            size = int.from_bytes(record[at + 2:at + 4], "big")
            body = record[at + 4:at + 4 + size]
            if kind == 0 and len(body) >= 5 and body[2] == 0:
                length = int.from_bytes(body[3:5], "big")
                name = body[5:5 + length].decode("ascii")
                return name.lower().rstrip(".") or None
            at += 4 + size
    except (IndexError, UnicodeDecodeError):
        return None
    return None
