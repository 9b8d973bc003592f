"""A team's secrets, E2B's ``/secrets`` (docs/teams.md, "Secrets"): named values a sandbox's
egress rules refer to as ``${e2b.secrets.<name>}``, which the node puts into matching
outbound requests so that code in the sandbox can use an API key it can never read.

A value is sealed with AES-256-GCM before it is stored (``store/secrets.py``): the key is
derived (HKDF-SHA256) from the node's operator key, so the database alone — a backup, a
copied file — gives nothing away, and the nodes of a cluster (one key) could open each
other's. The associated data binds a sealed value to its secret and version, so a value
cannot be moved to another secret by editing the database. No route ever returns a value:
only :meth:`Vault.reveal` opens one, for the egress proxy.

Changing the operator key makes the stored values unreadable (the secrets must be set
again); the node says so in the error of each use.

Where the sealed rows are kept is :class:`SecretRows`: the node's database
(``store/secrets.py``), or in cluster mode the cluster's Redis (``cluster/secret_store.py``),
so that a secret set through any node or gateway is there for every node's sandboxes. Either
holds only what :class:`Vault` sealed.
"""

from __future__ import annotations

import builtins
import os
import re
import secrets as token
import time
from collections.abc import Callable
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from aenv.core.errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from aenv.store.models import SecretRow

NAME = re.compile(r"^[a-z0-9_-]{1,128}$")
MAX_VALUE = 16 << 10
MAX_PER_TEAM = 1000
_INFO = b"aenv secrets v1"


def _check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = metadata or {}
    if len(metadata) > 32:
        raise InvalidArgument("a secret's metadata has at most 32 entries")
    total = 0
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key.encode()) > 128 or len(value.encode()) > 1024:
            raise InvalidArgument("metadata keys are at most 128 bytes, values 1024 bytes")
        total += len(key.encode()) + len(value.encode())
    if total > 8192:
        raise InvalidArgument("a secret's metadata is at most 8192 bytes in all")
    return dict(metadata)


def _check_value(value: str) -> bytes:
    raw = value.encode()
    if not raw or len(raw) > MAX_VALUE:
        raise InvalidArgument(f"a secret's value is 1 to {MAX_VALUE} bytes")
    if "\r" in value or "\n" in value:
        raise InvalidArgument("a secret's value cannot hold a line break (it goes into headers)")
    return raw


class SecretRows(Protocol):
    """A store of teams' sealed secrets. Names are unique per team (``insert`` raises
    ``AlreadyExists`` for a name the team has); ``update`` and ``delete`` of a secret that is
    gone do nothing; ``list`` is a team's secrets ordered by name (bytewise), those after
    ``after``. Every method may raise the store's own errors (``Unavailable``: it cannot be
    reached)."""

    async def insert(self, row: SecretRow) -> None: ...
    async def update(self, row: SecretRow) -> None: ...
    async def get(self, team_id: str, id_or_name: str) -> SecretRow | None: ...
    async def list(self, team_id: str, *, after: str | None,
                   limit: int) -> builtins.list[SecretRow]: ...
    async def delete(self, secret_id: str) -> None: ...
    async def count(self, team_id: str) -> int: ...


class Vault:
    def __init__(self, store: SecretRows, operator_key: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=_INFO).derive(operator_key.encode())
        self._aead = AESGCM(key)

    def _seal(self, value: bytes, secret_id: str, version: int) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, value, f"{secret_id}:{version}".encode())

    def seal_for(self, value: str, binding: str) -> bytes:
        """``value`` sealed under the vault's key, bound to ``binding`` (another kind of
        secret: a webhook's signing secret, ``webhook:<id>``)."""
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, value.encode(), binding.encode())

    def open_for(self, sealed: bytes, binding: str) -> str | None:
        """What :meth:`seal_for` sealed; None if another operator key sealed it."""
        try:
            return self._aead.decrypt(sealed[:12], sealed[12:], binding.encode()).decode()
        except InvalidTag:
            return None

    def _open(self, row: SecretRow) -> str:
        try:
            raw = self._aead.decrypt(row.sealed[:12], row.sealed[12:],
                                     f"{row.secret_id}:{row.current_version}".encode())
        except InvalidTag:
            raise Conflict(f"secret '{row.name}' cannot be opened: it was sealed with another "
                           "operator key; set it again") from None
        return raw.decode()

    async def create(self, team_id: str, name: str, value: str,
                     metadata: dict[str, str] | None = None) -> SecretRow:
        name = name.lower()
        if not NAME.match(name) or name.startswith("sec_"):
            raise InvalidArgument("a secret's name is 1-128 letters, digits, '_' and '-', "
                                  "not starting with 'sec_'")
        raw = _check_value(value)
        if await self.store.count(team_id) >= MAX_PER_TEAM:
            raise InvalidArgument(f"a team has at most {MAX_PER_TEAM} secrets")
        secret_id = "sec_" + token.token_hex(12)
        now = self.clock()
        row = SecretRow(secret_id, team_id, name, 1, _check_metadata(metadata), now, now,
                        self._seal(raw, secret_id, 1))
        try:
            await self.store.insert(row)
        except AlreadyExists:
            raise Conflict(f"a secret named '{name}' exists") from None
        return row

    async def update(self, team_id: str, id_or_name: str, value: str,
                     metadata: dict[str, str] | None = None) -> SecretRow:
        row = await self.get(team_id, id_or_name)
        raw = _check_value(value)
        version = row.current_version + 1
        updated = SecretRow(row.secret_id, team_id, row.name, version,
                            row.metadata if metadata is None else _check_metadata(metadata),
                            row.created_at, self.clock(),
                            self._seal(raw, row.secret_id, version))
        await self.store.update(updated)
        return updated

    async def get(self, team_id: str, id_or_name: str) -> SecretRow:
        row = await self.store.get(team_id, id_or_name)
        if row is None:
            raise NotFound(f"secret {id_or_name} not found")
        return row

    async def list(self, team_id: str, *, after: str | None,
                   limit: int) -> builtins.list[SecretRow]:
        return await self.store.list(team_id, after=after, limit=limit)

    async def delete(self, team_id: str, id_or_name: str) -> None:
        row = await self.get(team_id, id_or_name)
        await self.store.delete(row.secret_id)

    async def reveal(self, team_id: str, name: str) -> str | None:
        """The current value of the team's secret ``name`` (None: no such secret)."""
        row = await self.store.get(team_id, name)
        return self._open(row) if row is not None else None
