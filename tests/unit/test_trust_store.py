"""envd's trust store (envd/trust_store.py): the platform's CA put where the image's clients
look, once, in a root laid out as Debian's, Fedora's or none."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from aenv.envd import trust_store
from aenv.network.egress_tls import Interception


def _ca(seed: bytes, tmp_path: Path) -> str:
    return Interception(seed, tmp_path / "unused").ca_pem


def test_debian_bundle_gets_the_ca_once_and_clients_are_pointed_at_it(tmp_path: Path) -> None:
    bundle = tmp_path / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True)
    public = _ca(b"a public CA", tmp_path)
    bundle.write_text(public)
    (tmp_path / "etc/ssl/cert.pem").symlink_to(bundle)  # one file under two names
    ours = _ca(b"operator key", tmp_path)
    env = trust_store.install(trust_store.parse([ours]), root=tmp_path)
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
                   "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
                   "NODE_EXTRA_CA_CERTS": "/" + trust_store.OWN}
    trust_store.install(trust_store.parse([ours]), root=tmp_path)  # again: a resume, a fork
    text = bundle.read_text()
    assert text.count(ours.strip()) == 1 and text.startswith(public)
    assert (tmp_path / trust_store.OWN).read_text().strip() == ours.strip()
    # The bundle still loads, both CAs in it.
    context = ssl.create_default_context(cafile=str(bundle))
    assert len(context.get_ca_certs()) == 2


def test_fedora_layout_and_an_image_without_a_bundle(tmp_path: Path) -> None:
    ours = _ca(b"operator key", tmp_path)
    fedora = tmp_path / "fedora"
    (fedora / "etc/pki/tls/certs").mkdir(parents=True)
    (fedora / "etc/pki/tls/certs/ca-bundle.crt").write_text("")
    env = trust_store.install([ours.strip() + "\n"], root=fedora)
    assert env["SSL_CERT_FILE"] == "/etc/pki/tls/certs/ca-bundle.crt"
    assert (fedora / "etc/pki/tls/certs/ca-bundle.crt").read_text() == ours.strip() + "\n"
    bare = tmp_path / "bare"
    bare.mkdir()
    env = trust_store.install([ours.strip() + "\n"], root=bare)
    assert (bare / trust_store.BUNDLES[0]).read_text().strip() == ours.strip()
    assert trust_store.install([], root=bare) == {}


@pytest.mark.parametrize("value", [
    "-----BEGIN CERTIFICATE-----", ["not a certificate"], [1],
    ["-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
     "-----BEGIN CERTIFICATE-----\ny\n-----END CERTIFICATE-----"],
    ["-----BEGIN CERTIFICATE-----\n" + "x" * 20_000 + "\n-----END CERTIFICATE-----"],
    ["-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"] * 5,
])
def test_anything_but_a_few_pem_certificates_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        trust_store.parse(value)
