"""Workload identity, E2B's ``iam`` (docs/teams.md, "Workload identity (iam)"): short-lived
JWT-SVIDs naming one sandbox, minted for the audiences its create asked for, which the
egress proxy puts into outbound requests where a network rule says
``${e2b.identity.tokens.<name>}``. Code in the sandbox can call a verifier (AWS STS, a
cloud's workload identity federation, your own service) as that sandbox, without ever
holding a token it could keep or a key it could sign with.

Owns the signing key and the cache of minted tokens, nothing else: it reads no store and
writes nothing to disk. The key is EC P-256, derived (HKDF-SHA256) from the node's operator
key, so every node of a cluster (one key) signs with the same key and publishes the same
JWK set, and a restart changes nothing a verifier has cached. Changing the operator key
changes the signing key: verifiers pick up the new one from the published JWKS (its ``kid``
changes with it); tokens signed with the old key stop verifying at once.

A token (SPIFFE JWT-SVID): header ``alg: ES256``, ``typ: JWT``, ``kid`` (the key's RFC 7638
thumbprint); claims ``sub = spiffe://<trust domain>/team/<team>/sandbox/<sandbox id>``,
``aud = [<audience>]``, ``iss``, ``iat``, ``exp = iat + 300``, a random ``jti``. A minted
token is served again for the same sandbox and name until ``CACHE_MARGIN_S`` before it
expires, so a busy sandbox costs one signature every four minutes, not one per request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from aenv.core.errors import InvalidArgument

TOKEN_TYPE = "JWT-SVID"
ALGORITHM = "ES256"
#: A token's lifetime: short enough that one leaked from a request log is soon useless,
#: long enough for a verifier's clock skew and an STS round trip.
TOKEN_TTL_S = 300
#: A cached token is served until this long before it expires, so the verifier never
#: receives one with less than a minute left.
CACHE_MARGIN_S = 60
#: Minted tokens kept (sandbox, name) → token; the least recently used goes first.
CACHE_ENTRIES = 10_000
MAX_TOKENS = 16
MAX_AUDIENCE = 1024
_INFO = b"aenv workload identity v1"
# The SDK's rule (e2b/sandbox/iam.py): the proxy reads a placeholder's name up to the next
# "}", so a brace would end it early or open another one; control characters cannot travel
# in a header. The class is Unicode's Cc (U+0000-U+001F, U+007F-U+009F).
_BAD_NAME = re.compile(r"[{}\x00-\x1f\x7f-\x9f]")
# SPIFFE ID: a trust domain of lowercase letters, digits, '.', '-', '_'; path segments of
# letters, digits, '.', '-', '_' (not '.' or '..').
_TRUST_DOMAIN = re.compile(r"^[a-z0-9._-]{1,255}$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class TokenSpec:
    """One entry of a create's ``iam.tokens``: the name a network rule refers to, the
    audience the token is minted for, and its type (only ``JWT-SVID``)."""

    name: str
    audience: str
    token_type: str = TOKEN_TYPE


def parse_iam(value: object) -> tuple[TokenSpec, ...]:
    """A create body's ``iam`` (``{"tokens": {<name>: {"audience", "tokenType"}}}``) as token
    specs in the order given; ``None``, ``{}`` and ``{"tokens": {}}`` are none.

    Raises :class:`InvalidArgument` (a 400) naming what is wrong: a non-object, a name that
    is empty or holds ``{``, ``}`` or a control character, an audience that is not a string
    of 1 to 1024 characters, a type other than ``JWT-SVID``, more than 16 tokens. Fields it
    does not know are ignored, as in the rest of the create body (a newer SDK may send
    them)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidArgument("iam must be an object: {\"tokens\": {<name>: {...}}}")
    tokens = value.get("tokens")
    if tokens is None:
        return ()
    if not isinstance(tokens, Mapping):
        raise InvalidArgument("iam.tokens must be an object keyed by token name")
    if len(tokens) > MAX_TOKENS:
        raise InvalidArgument(f"iam.tokens has at most {MAX_TOKENS} tokens")
    return tuple(_token(name, spec) for name, spec in tokens.items())


def iam_body(specs: tuple[TokenSpec, ...]) -> dict[str, Any] | None:
    """``specs`` as a create body's ``iam`` (what ``parse_iam`` reads back); None: none."""
    if not specs:
        return None
    return {"tokens": {t.name: {"audience": t.audience, "tokenType": t.token_type}
                       for t in specs}}


def _token(name: object, spec: object) -> TokenSpec:
    if not isinstance(name, str) or not name or _BAD_NAME.search(name):
        raise InvalidArgument(
            f"iam token name {name!r} is not usable: a name is a non-empty string without "
            "'{', '}' or control characters (it goes into '${e2b.identity.tokens.<name>}')")
    if not isinstance(spec, Mapping):
        raise InvalidArgument(f"iam token {name!r} must be an object with 'audience' and "
                              "'tokenType'")
    audience = spec.get("audience")
    if not isinstance(audience, str) or not audience or len(audience) > MAX_AUDIENCE:
        raise InvalidArgument(f"iam token {name!r}: audience must be a string of 1 to "
                              f"{MAX_AUDIENCE} characters")
    token_type = spec.get("tokenType")
    if token_type != TOKEN_TYPE:
        raise InvalidArgument(f"iam token {name!r}: tokenType {token_type!r} is not "
                              f"supported (only {TOKEN_TYPE!r})")
    return TokenSpec(name, audience, token_type)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _signing_key(operator_key: str) -> ec.EllipticCurvePrivateKey:
    # 40 bytes, 8 more than the order's 32, so that reducing them leaves no bias that
    # matters (FIPS 186-5 A.2.1); (c mod (n - 1)) + 1 is never zero.
    raw = HKDF(algorithm=hashes.SHA256(), length=40, salt=None,
               info=_INFO).derive(operator_key.encode())
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's n
    scalar = int.from_bytes(raw, "big") % (order - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def _segment(value: str, what: str) -> str:
    if not _SEGMENT.match(value) or value in (".", ".."):
        raise InvalidArgument(f"{what} {value!r} cannot be part of a SPIFFE ID")
    return value


@dataclass(frozen=True)
class _Minted:
    audience: str
    team: str
    token: str
    expires: float


class Issuer:
    """Mints this node's workload tokens and publishes the key they verify with.

    ``operator_key`` is the node's (the cluster's) operator key; ``issuer`` the URL
    verifiers know this issuer by (its ``/.well-known/openid-configuration`` is served
    under it), written into every token's ``iss``; ``trust_domain`` the SPIFFE trust
    domain of the tokens' subjects."""

    def __init__(self, operator_key: str, issuer: str, trust_domain: str = "aenv.local",
                 clock: Callable[[], float] = time.time) -> None:
        if not operator_key:
            raise ValueError("workload identity needs the operator key")
        if not issuer:
            raise ValueError("workload identity needs an issuer URL")
        if not _TRUST_DOMAIN.match(trust_domain):
            raise ValueError(f"trust domain {trust_domain!r}: lowercase letters, digits, "
                             "'.', '-' and '_'")
        self.issuer = issuer.rstrip("/")
        self.trust_domain = trust_domain
        self.clock = clock
        self._key = _signing_key(operator_key)
        public = self._key.public_key().public_numbers()
        self._jwk: dict[str, str] = {
            "kty": "EC", "crv": "P-256",
            "x": _b64url(public.x.to_bytes(32, "big")),
            "y": _b64url(public.y.to_bytes(32, "big")),
        }
        # RFC 7638: the required members, sorted, no whitespace, hashed with SHA-256.
        canonical = json.dumps(self._jwk, sort_keys=True, separators=(",", ":"))
        self.kid = _b64url(hashlib.sha256(canonical.encode()).digest())
        self._cache: OrderedDict[tuple[str, str], _Minted] = OrderedDict()

    def subject(self, sandbox_id: str, team_id: str | None) -> str:
        """The SPIFFE ID naming a sandbox of a team (None: the default team)."""
        team = _segment(team_id or "default", "team id")
        return (f"spiffe://{self.trust_domain}/team/{team}"
                f"/sandbox/{_segment(sandbox_id, 'sandbox id')}")

    def mint(self, sandbox_id: str, team_id: str | None, spec: TokenSpec,
             now: float | None = None) -> str:
        """A JWT-SVID for ``sandbox_id`` with ``spec``'s audience, valid ``TOKEN_TTL_S``:
        the one minted for this sandbox and name before while it has more than
        ``CACHE_MARGIN_S`` left (and was minted for the same audience and team), else a new
        one."""
        if spec.token_type != TOKEN_TYPE:
            raise InvalidArgument(f"token type {spec.token_type!r} is not supported")
        now = self.clock() if now is None else now
        team = team_id or "default"
        key = (sandbox_id, spec.name)
        cached = self._cache.get(key)
        if (cached is not None and cached.audience == spec.audience and cached.team == team
                and now < cached.expires - CACHE_MARGIN_S):
            self._cache.move_to_end(key)
            return cached.token
        iat = int(now)
        claims: dict[str, Any] = {
            "sub": self.subject(sandbox_id, team_id),
            "aud": [spec.audience],
            "iss": self.issuer,
            "iat": iat,
            "exp": iat + TOKEN_TTL_S,
            "jti": secrets.token_urlsafe(16),
        }
        token = jwt.encode(claims, self._key, algorithm=ALGORITHM,
                           headers={"kid": self.kid, "typ": "JWT"})
        self._cache[key] = _Minted(spec.audience, team, token, float(iat + TOKEN_TTL_S))
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return token

    def forget(self, sandbox_id: str) -> None:
        """Drop the sandbox's cached tokens (it was killed): a new sandbox never gets them,
        and the cache's room goes to live ones."""
        for key in [k for k in self._cache if k[0] == sandbox_id]:
            del self._cache[key]

    def jwks(self) -> dict[str, Any]:
        """The RFC 7517 JWK set verifiers check tokens against (``/.well-known/jwks.json``)."""
        return {"keys": [{**self._jwk, "kid": self.kid, "use": "sig", "alg": ALGORITHM}]}

    def openid_configuration(self, base_url: str | None = None) -> dict[str, Any]:
        """The OpenID Connect discovery document (``/.well-known/openid-configuration``)
        that lets a verifier such as AWS IAM find the keys from the issuer URL alone;
        ``base_url`` is where ``jwks.json`` is served (default: the issuer)."""
        base = (base_url or self.issuer).rstrip("/")
        return {
            "issuer": self.issuer,
            "jwks_uri": f"{base}/.well-known/jwks.json",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [ALGORITHM],
            "claims_supported": ["sub", "aud", "iss", "iat", "exp", "jti"],
        }
