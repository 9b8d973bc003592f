"""Identifiers and secrets: sandbox ids, envd access tokens, API keys."""

from __future__ import annotations

import re
import secrets
import string
import uuid

_ALPHABET = string.ascii_lowercase + string.digits

#: E2B sandbox ids: DNS-label safe, no '-', fixed length (runsc also matches ids by prefix, so a
#: fixed length keeps one id from being a prefix of another).
SANDBOX_ID_LEN = 20
SANDBOX_ID_RE = re.compile(r"^[a-z0-9]{20}$")
API_KEY_RE = re.compile(r"^e2b_[0-9a-f]{40}$")


def new_sandbox_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(SANDBOX_ID_LEN))


def is_sandbox_id(value: str) -> bool:
    return bool(SANDBOX_ID_RE.match(value))


def new_access_token() -> str:
    """envd's X-Access-Token for one sandbox."""
    return secrets.token_hex(24)


def new_api_key() -> str:
    """Shaped like E2B's keys, which SDKs up to 2.45 validate as ``^e2b_[0-9a-f]+$``."""
    return "e2b_" + secrets.token_hex(20)


def new_client_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(8))


#: Snapshot ids: a recognisable prefix plus 16 random characters (E2B ids are opaque strings).
SNAPSHOT_ID_PREFIX = "snap"


def new_snapshot_id() -> str:
    return SNAPSHOT_ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(16))


def new_volume_id() -> str:
    """A volume id: a UUID, as E2B's (its server answers 400 to anything else)."""
    return str(uuid.uuid4())


def is_volume_id(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False
