"""The platform's CA in the sandbox's trust (``/init``'s ``trustCertificates``, aenv's).

A sandbox whose egress rules set headers on an HTTPS host has its TLS to that host ended by
the node (network/egress_tls.py), with a certificate from the platform's CA; the sandbox's
clients accept it because envd puts the CA where they look:

* appended to each system bundle the image has (Debian/Ubuntu/Alpine's
  ``/etc/ssl/certs/ca-certificates.crt``, Fedora/RHEL's ``/etc/pki/tls/certs/ca-bundle.crt``,
  ``/etc/ssl/cert.pem``): curl, OpenSSL, Python's ``ssl``, Go and most others;
* ``SSL_CERT_FILE`` and ``REQUESTS_CA_BUNDLE`` set to that bundle in the sandbox's env
  (``requests`` and ``httpx`` otherwise read certifi's own copy), and ``NODE_EXTRA_CA_CERTS``
  to the CA alone (Node.js reads only its built-in list).

Idempotent: a certificate a bundle already holds is not added again, so a sandbox restored,
forked or given rules again keeps one copy. An image with no bundle gets the Debian one, the
CA alone in it, so that HTTPS to the hosts with rules works there too.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where images keep their bundle, most common first.
BUNDLES = ("etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt",
           "etc/ssl/cert.pem")
#: The CA alone (update-ca-certificates' own directory, so a later run of it keeps it).
OWN = "usr/local/share/ca-certificates/aenv-egress.crt"
MAX_CERTIFICATES = 4
MAX_PEM = 16 << 10
_BEGIN = "-----BEGIN CERTIFICATE-----"
_END = "-----END CERTIFICATE-----"


def parse(value: object) -> list[str]:
    """The certificates of an ``/init`` body's ``trustCertificates``; ValueError if it is not
    a short list of PEM certificates."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_CERTIFICATES:
        raise ValueError(f"trustCertificates must be a list of at most {MAX_CERTIFICATES} "
                         "PEM certificates")
    out = []
    for pem in value:
        if not isinstance(pem, str) or len(pem) > MAX_PEM:
            raise ValueError("trustCertificates holds PEM certificates of at most 16 KiB")
        text = pem.strip()
        if not (text.startswith(_BEGIN) and text.endswith(_END)) or text.count(_BEGIN) != 1:
            raise ValueError("trustCertificates holds one PEM certificate per entry")
        out.append(text + "\n")
    return out


def install(certificates: list[str], root: Path = Path("/")) -> dict[str, str]:
    """Put ``certificates`` into the image's trust; the env vars that point clients at it.
    Raises OSError when the files cannot be written."""
    if not certificates:
        return {}
    own = root / OWN
    own.parent.mkdir(parents=True, exist_ok=True)
    _write(own, "".join(certificates))
    seen: set[Path] = set()
    first: Path | None = None
    for relative in BUNDLES:
        path = root / relative
        if not path.exists():
            continue
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        first = first or path
        held = real.read_text(errors="replace")
        missing = [c for c in certificates if c.strip() not in held]
        if missing:
            with real.open("a") as bundle:
                bundle.write(("" if held.endswith("\n") or not held else "\n")
                             + "".join(missing))
    if first is None:
        first = root / BUNDLES[0]
        first.parent.mkdir(parents=True, exist_ok=True)
        _write(first, "".join(certificates))
    inside = "/" + str(first.relative_to(root))
    return {"SSL_CERT_FILE": inside, "REQUESTS_CA_BUNDLE": inside,
            "NODE_EXTRA_CA_CERTS": "/" + OWN}


def _write(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(text)
    scratch.chmod(0o644)
    scratch.replace(path)
