"""Workload identity (``orchestrator/workload_identity.py``, ``api/identity.py``): what a
create's ``iam`` may say, and that the tokens a node mints verify — with PyJWT, against the
JWK set the node publishes — for their audience only, across nodes sharing an operator key
and not with another key; the cache's window."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from types import SimpleNamespace
from typing import Any

import jwt
import pytest
from e2b.sandbox.iam import INVALID_IAM_TOKEN_NAME_CHARS
from fastapi import FastAPI
from fastapi.testclient import TestClient

from aenv.api import identity as identity_api
from aenv.core.errors import InvalidArgument
from aenv.orchestrator import workload_identity as wi
from aenv.orchestrator.workload_identity import Issuer, TokenSpec, parse_iam

KEY = "e2b_" + "ab" * 20
ISSUER = "https://aenv.example.com"
SID = "i" * 20
NOW = 1_700_000_000.0


def _verify(issuer: Issuer, token: str, audience: str) -> dict[str, Any]:
    """What a verifier does: the key named by the token's kid, from the published set."""
    keys = jwt.PyJWKSet.from_dict(issuer.jwks())
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in keys.keys if k.key_id == kid)
    claims: dict[str, Any] = jwt.decode(
        token, key, algorithms=["ES256"], audience=audience, issuer=ISSUER,
        options={"require": ["sub", "aud", "iss", "iat", "exp", "jti"]})
    return claims


@pytest.fixture
def issuer() -> Issuer:
    # PyJWT checks exp against the wall clock: the tests that verify mint at time.time(),
    # the others at the fixed NOW.
    return Issuer(KEY, ISSUER)


# -- parse_iam -----------------------------------------------------------------------------

def test_no_iam_is_no_tokens() -> None:
    assert parse_iam(None) == ()
    assert parse_iam({}) == ()
    assert parse_iam({"tokens": {}}) == ()
    assert parse_iam({"tokens": None}) == ()


def test_tokens_are_parsed_in_order() -> None:
    specs = parse_iam({"tokens": {
        "aws": {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"},
        "mine": {"audience": "https://api.example.com", "tokenType": "JWT-SVID",
                 "futureField": 1},
    }, "futureField": True})
    assert specs == (TokenSpec("aws", "sts.amazonaws.com", "JWT-SVID"),
                     TokenSpec("mine", "https://api.example.com", "JWT-SVID"))
    # Names the SDK allows: anything without braces or control characters.
    assert parse_iam({"tokens": {"a b.c/é:1": {"audience": "x", "tokenType": "JWT-SVID"}}})
    assert parse_iam({"tokens": {"x": {"audience": "a" * 1024, "tokenType": "JWT-SVID"}}})
    sixteen = {f"t{i}": {"audience": "x", "tokenType": "JWT-SVID"} for i in range(16)}
    assert len(parse_iam({"tokens": sixteen})) == 16


def test_the_name_rule_is_the_sdks() -> None:
    assert wi._BAD_NAME.pattern == INVALID_IAM_TOKEN_NAME_CHARS.pattern


GOOD = {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}


@pytest.mark.parametrize(("iam", "says"), [
    ("tokens", "iam must be an object"),
    ([GOOD], "iam must be an object"),
    ({"tokens": [GOOD]}, "iam.tokens must be an object"),
    ({"tokens": "aws"}, "iam.tokens must be an object"),
    ({"tokens": {"": GOOD}}, "name ''"),
    ({"tokens": {"a}b": GOOD}}, "not usable"),
    ({"tokens": {"a{b": GOOD}}, "not usable"),
    ({"tokens": {"a\nb": GOOD}}, "not usable"),
    ({"tokens": {"a\x00": GOOD}}, "not usable"),
    ({"tokens": {"a\x7f": GOOD}}, "not usable"),
    ({"tokens": {"a\x85": GOOD}}, "not usable"),
    ({"tokens": {"aws": "sts.amazonaws.com"}}, "must be an object"),
    ({"tokens": {"aws": {"tokenType": "JWT-SVID"}}}, "audience must be"),
    ({"tokens": {"aws": {"audience": "", "tokenType": "JWT-SVID"}}}, "audience must be"),
    ({"tokens": {"aws": {"audience": 7, "tokenType": "JWT-SVID"}}}, "audience must be"),
    ({"tokens": {"aws": {"audience": "a" * 1025, "tokenType": "JWT-SVID"}}},
     "audience must be"),
    ({"tokens": {"aws": {"audience": "x"}}}, "tokenType None"),
    ({"tokens": {"aws": {"audience": "x", "tokenType": "jwt-svid"}}}, "not supported"),
    ({"tokens": {"aws": {"audience": "x", "tokenType": "X509-SVID"}}}, "not supported"),
    ({"tokens": {f"t{i}": GOOD for i in range(17)}}, "at most 16"),
])
def test_refusals(iam: object, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says.replace("{", r"\{").replace("}", r"\}")):
        parse_iam(iam)


# -- minting and verifying -----------------------------------------------------------------

def test_a_minted_token_verifies_against_the_published_keys() -> None:
    now = time.time()
    issuer = Issuer(KEY, ISSUER + "/")
    token = issuer.mint(SID, "team-1", TokenSpec("aws", "sts.amazonaws.com"), now=now)
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "ES256", "typ": "JWT", "kid": issuer.kid}
    claims = _verify(issuer, token, "sts.amazonaws.com")
    assert claims["sub"] == f"spiffe://aenv.local/team/team-1/sandbox/{SID}"
    assert claims["aud"] == ["sts.amazonaws.com"]
    assert claims["iss"] == ISSUER
    assert claims["exp"] - claims["iat"] == 300 and claims["iat"] == int(now)
    assert len(claims["jti"]) >= 16
    # The default team; another trust domain.
    other = Issuer(KEY, ISSUER, trust_domain="prod.example")
    token = other.mint(SID, None, TokenSpec("aws", "sts.amazonaws.com"), now=now)
    assert (_verify(other, token, "sts.amazonaws.com")["sub"]
            == f"spiffe://prod.example/team/default/sandbox/{SID}")


def test_another_audience_does_not_verify() -> None:
    issuer = Issuer(KEY, ISSUER)
    token = issuer.mint(SID, None, TokenSpec("mine", "https://api.example.com"),
                        now=time.time())
    with pytest.raises(jwt.InvalidAudienceError):
        _verify(issuer, token, "sts.amazonaws.com")


def test_an_expired_token_does_not_verify(issuer: Issuer) -> None:
    token = issuer.mint(SID, None, TokenSpec("aws", "sts.amazonaws.com"), now=NOW)
    keys = jwt.PyJWKSet.from_dict(issuer.jwks())
    with pytest.raises(jwt.ExpiredSignatureError):
        jwt.decode(token, keys.keys[0], algorithms=["ES256"], audience="sts.amazonaws.com")


def test_nodes_sharing_the_operator_key_publish_one_key() -> None:
    now = time.time()
    a, b = Issuer(KEY, ISSUER), Issuer(KEY, ISSUER)
    assert a.jwks() == b.jwks()
    token = a.mint(SID, None, TokenSpec("aws", "sts.amazonaws.com"), now=now)
    assert _verify(b, token, "sts.amazonaws.com")["sub"].endswith(SID)
    other = Issuer(KEY + "x", ISSUER)
    assert other.jwks() != a.jwks() and other.kid != a.kid
    # Against the other key's set: no key of that id, and the other key's signature fails.
    with pytest.raises(StopIteration):
        _verify(other, token, "sts.amazonaws.com")
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, jwt.PyJWKSet.from_dict(other.jwks()).keys[0], algorithms=["ES256"],
                   audience="sts.amazonaws.com")


def test_the_jwks_and_discovery_documents(issuer: Issuer) -> None:
    (key,) = issuer.jwks()["keys"]
    assert key["kty"] == "EC" and key["crv"] == "P-256"
    assert key["use"] == "sig" and key["alg"] == "ES256" and key["kid"] == issuer.kid
    assert "d" not in key
    # RFC 7638's thumbprint: SHA-256 of the required members, sorted, without whitespace.
    canonical = json.dumps({m: key[m] for m in ("crv", "kty", "x", "y")},
                           separators=(",", ":"))
    assert key["kid"] == base64.urlsafe_b64encode(
        hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
    doc = issuer.openid_configuration()
    assert doc["issuer"] == ISSUER
    assert doc["jwks_uri"] == f"{ISSUER}/.well-known/jwks.json"
    assert doc["id_token_signing_alg_values_supported"] == ["ES256"]
    assert doc["subject_types_supported"] == ["public"]
    assert (issuer.openid_configuration("https://keys.example.com/")["jwks_uri"]
            == "https://keys.example.com/.well-known/jwks.json")


def test_bad_subjects_and_settings_are_refused(issuer: Issuer) -> None:
    with pytest.raises(InvalidArgument):
        issuer.mint("../x", None, TokenSpec("a", "b"), now=NOW)
    with pytest.raises(InvalidArgument):
        issuer.mint(SID, "a/b", TokenSpec("a", "b"), now=NOW)
    with pytest.raises(InvalidArgument):
        issuer.mint(SID, None, TokenSpec("a", "b", "X509-SVID"), now=NOW)
    with pytest.raises(ValueError):
        Issuer(KEY, ISSUER, trust_domain="Upper.Case")
    with pytest.raises(ValueError):
        Issuer("", ISSUER)
    with pytest.raises(ValueError):
        Issuer(KEY, "")


# -- the cache -----------------------------------------------------------------------------

def test_the_cache_serves_a_token_until_a_minute_before_it_expires(issuer: Issuer) -> None:
    spec = TokenSpec("aws", "sts.amazonaws.com")
    first = issuer.mint(SID, None, spec, now=NOW)
    assert issuer.mint(SID, None, spec, now=NOW + 239) == first
    renewed = issuer.mint(SID, None, spec, now=NOW + 240)
    assert renewed != first
    assert jwt.decode(renewed, options={"verify_signature": False})["iat"] == int(NOW + 240)
    # Per sandbox and name; a changed audience or team is a new token.
    assert issuer.mint("j" * 20, None, spec, now=NOW + 240) != renewed
    assert issuer.mint(SID, None, TokenSpec("other", spec.audience), now=NOW + 240) != renewed
    changed = issuer.mint(SID, None, TokenSpec("aws", "https://x"), now=NOW + 241)
    assert changed != renewed
    assert issuer.mint(SID, "team-2", TokenSpec("aws", "https://x"), now=NOW + 241) != changed
    # The clock is the issuer's when no time is given.
    clocked = Issuer(KEY, ISSUER, clock=lambda: NOW)
    assert clocked.mint(SID, None, spec) == clocked.mint(SID, None, spec, now=NOW + 10)


def test_the_cache_is_bounded_and_forgets_a_sandbox(monkeypatch: pytest.MonkeyPatch,
                                                    issuer: Issuer) -> None:
    monkeypatch.setattr(wi, "CACHE_ENTRIES", 3)
    spec = TokenSpec("aws", "sts.amazonaws.com")
    tokens = [issuer.mint(f"s{i}", None, spec, now=NOW) for i in range(4)]
    assert len(issuer._cache) == 3
    assert issuer.mint("s0", None, spec, now=NOW) != tokens[0]  # the oldest went first
    assert issuer.mint("s3", None, spec, now=NOW) == tokens[3]
    issuer.forget("s3")
    assert issuer.mint("s3", None, spec, now=NOW) != tokens[3]


# -- the routes ----------------------------------------------------------------------------

def test_the_routes_answer_without_authentication(issuer: Issuer) -> None:
    app = FastAPI()
    app.include_router(identity_api.router)
    app.state.node = SimpleNamespace(identity=issuer)
    with TestClient(app) as client:
        keys = client.get("/.well-known/jwks.json")
        assert keys.status_code == 200 and keys.json() == issuer.jwks()
        assert keys.headers["cache-control"] == identity_api.CACHE_CONTROL
        doc = client.get("/.well-known/openid-configuration", headers={"Host": "evil.test"})
        assert doc.status_code == 200 and doc.json() == issuer.openid_configuration()
