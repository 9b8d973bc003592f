"""Configuration of the cluster's two stateless roles, ``aenv scheduler`` and ``aenv gateway``.

The node's pattern (``core/settings.py``): frozen pydantic settings, ``AENV_*`` environment
variables over the TOML file named by ``AENV_CONFIG`` (default ``/etc/aenv/aenv.toml`` if it
exists) over defaults, read once by the command and passed in. Command-line options win over
both. The variable names are the ones these commands always read, and a field the node has
too (``cluster``, ``api_key``, the gateway's limits) is the node's own setting: one file or
one environment can serve a node and a gateway on the same machine.

A file serves several roles, so keys a role does not know are ignored here (the node's
``home``, ``listen``, ...). The node refuses keys it does not know: a file a node also reads
must not hold ``scheduler`` or ``key_quota`` (set those in the environment, or give the role
a file of its own). ``docs/deployment.md`` holds the reference generated from the field
docstrings (``python -m aenv.cluster.settings``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    SettingsConfigDict,
)

from aenv.core.settings import AenvSources, Settings
from aenv.edge.limits import BodyLimits
from aenv.edge.protocol import ConnectionLimits

DEFAULT_SCHEDULER_URL = "http://127.0.0.1:9090"
#: What ``redis_client.connect`` can open: one server (TLS or not, TCP or a socket), or a
#: Sentinel group.
_REDIS_URL = r"^(redis|rediss|unix|redis\+sentinel)://"


def _node_field(name: str) -> Any:
    """The node's field ``name``: the same default, bounds and docstring, so the gateway
    holds the node's limits under the node's names without a second copy to drift."""
    return copy.deepcopy(Settings.model_fields[name])


class RoleSettings(AenvSources):
    """What every cluster role reads: where the cluster's Redis is."""

    model_config = SettingsConfigDict(
        env_prefix="AENV_", frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    cluster: str | None = Field(default=None, pattern=_REDIS_URL)
    """The cluster's Redis URL (``redis://[:password@]host:6379/0``, or
    ``redis+sentinel://s1:26379,s2:26379/<master>/0``); ``--cluster`` wins. Required."""

    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line, with the request's id (as the node's)."""


class SchedulerSettings(RoleSettings):
    """``aenv scheduler``."""

    key_quota: int = Field(default=0, ge=0)
    """Sandboxes (running, paused or starting) one API key may hold in the whole cluster,
    its open reservations counted; a placement past it is answered 429 ``quota_exceeded``.
    0: no quota. ``--key-quota`` wins."""


class GatewaySettings(RoleSettings):
    """``aenv gateway``: where its scheduler is, the cluster's key, and the nodes' limits."""

    scheduler: str = Field(default=DEFAULT_SCHEDULER_URL, pattern=r"^https?://")
    """The URL of the scheduler this gateway asks where sandboxes go (any replica);
    ``--scheduler`` wins."""

    api_key: str | None = None
    """The cluster's API key (the nodes' ``AENV_API_KEY``): the gateway checks ``X-API-KEY``
    on the control plane before it reserves anything; ``--api-key`` wins. Unset: not checked
    at the gateway (the nodes still check it)."""

    tls_cert_file: Path | None = None
    """With ``tls_key_file``: the gateway serves HTTPS on its listen address with this
    certificate (PEM; a wildcard for ``*.<sandbox domain>``: docs/deployment.md, "HTTPS
    hostnames"). Unset: HTTP."""
    tls_key_file: Path | None = None
    """The private key (PEM) of the gateway's ``tls_cert_file``."""

    max_body_bytes: int = _node_field("max_body_bytes")
    max_upload_bytes: int = _node_field("max_upload_bytes")
    proxy_max_body_bytes: int = _node_field("proxy_max_body_bytes")
    body_idle_timeout_s: float = _node_field("body_idle_timeout_s")
    max_header_bytes: int = _node_field("max_header_bytes")
    header_read_timeout_s: float = _node_field("header_read_timeout_s")
    idle_timeout_s: int = _node_field("idle_timeout_s")
    shutdown_grace_s: int = _node_field("shutdown_grace_s")
    max_slow_connections_per_client: int = _node_field("max_slow_connections_per_client")

    @model_validator(mode="after")
    def _tls_whole(self) -> GatewaySettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    def body_limits(self) -> BodyLimits:
        return BodyLimits(api=self.max_body_bytes, proxy=self.proxy_max_body_bytes,
                          upload=self.max_upload_bytes, idle_s=self.body_idle_timeout_s)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(max_header_bytes=self.max_header_bytes,
                                header_read_timeout_s=self.header_read_timeout_s,
                                max_slow_per_client=self.max_slow_connections_per_client)


def describe(exc: ValidationError, options: Collection[str] = ()) -> str:
    """One line for an invalid configuration: each bad setting by where it was given (a
    command-line option among ``options``, else its variable), the value and what is wrong."""
    parts = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        where = (f"--{name.replace('_', '-')} " if name in options
                 else f"AENV_{name.upper()}=")
        parts.append(f"{where}{error.get('input')!r}: {error['msg']}")
    return "invalid configuration: " + "; ".join(parts)


def reference_markdown() -> str:
    """The reference table of both roles' settings, from the field docstrings."""
    lines = [
        "| role | key | env | default | description |",
        "|---|---|---|---|---|",
    ]
    for role, cls in (("both", RoleSettings), ("scheduler", SchedulerSettings),
                      ("gateway", GatewaySettings)):
        inherited = RoleSettings.model_fields if cls is not RoleSettings else {}
        for name, field in cls.model_fields.items():
            if name in inherited:
                continue
            default = field.default if field.default is not None else ""
            doc = " ".join((field.description or "").split())
            node = Settings.model_fields.get(name)
            if node is not None and node.description == field.description:
                doc = "The node's limit, held at the gateway too ([config.md](config.md))."
            lines.append(f"| {role} | `{name}` | `AENV_{name.upper()}` | `{default}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
