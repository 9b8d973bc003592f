"""What one request or connection may cost the node: bodies, headers, slow clients, metadata."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class RequestLimits(Section):
    """Requests: what one request or connection may cost the node.

    Bodies, headers and slow clients are bounded at the edge (``edge/``); metadata and
    environment variables at the API."""

    max_upload_bytes: int = Field(default=10 << 30, gt=0)
    """Largest build-file upload (a COPY step's archive or a Dockerfile build context)."""

    max_body_bytes: int = Field(default=4 << 20, gt=0)
    """Largest request body of the node's own API (and of the gateway's control plane): a
    larger ``Content-Length`` is answered 413 before the body is read, a chunked body 413 as
    soon as it passes the limit (docs/limits.md). Build-file uploads have
    ``max_upload_bytes``; sandbox traffic ``proxy_max_body_bytes``."""

    proxy_max_body_bytes: int = Field(default=0, ge=0)
    """Largest request body passed to a sandbox port (envd's ``/files`` uploads included), in
    bytes; 0: unbounded. The proxy streams bodies to the guest as they arrive, so the node
    holds at most ~64 KiB of one at a time whatever its size."""

    max_header_bytes: int = Field(default=65_536, ge=1024)
    """Largest request head (request line and headers); larger is answered 431."""

    header_read_timeout_s: float = Field(default=15.0, gt=0)
    """A request head (or a new connection's first request) must arrive within this long;
    otherwise the connection is closed (a slow-loris client cannot hold it)."""

    body_idle_timeout_s: float = Field(default=60.0, gt=0)
    """The node's API answers 408 when a request body stops arriving for this long (sandbox
    traffic is exempt: a Connect client stream may be quiet for as long as it likes)."""

    idle_timeout_s: int = Field(default=75, ge=1)
    """A kept-alive connection with no request for this long is closed."""

    shutdown_grace_s: int = Field(default=10, ge=1)
    """At SIGTERM, requests under way get this long to finish; then their connections are
    closed (a command's output stream or a proxied WebSocket would otherwise hold the node
    up for as long as it lasts). The sandboxes keep running either way."""

    max_slow_connections_per_client: int = Field(default=128, ge=1)
    """Connections one client address may have waiting for their request head. Past it, a new
    connection replaces the client's oldest waiting one if that one has waited a second (408),
    and a burst of new ones is let through up to four times this, then answered 429: one
    client's slow connections cannot starve the others. Connections with a request under way,
    or idle between requests, do not count."""

    max_metadata_keys: int = Field(default=100, ge=0)
    """Most metadata keys a sandbox may carry (create; 400 past it)."""

    max_metadata_key_bytes: int = Field(default=256, ge=1)
    """Longest metadata key, UTF-8 bytes."""

    max_metadata_value_bytes: int = Field(default=4096, ge=1)
    """Longest metadata value, UTF-8 bytes."""

    max_metadata_bytes: int = Field(default=65_536, ge=1)
    """Most bytes of a sandbox's metadata, keys and values together."""

    max_env_vars: int = Field(default=1000, ge=0)
    """Most environment variables a create may set."""

    max_env_var_name_bytes: int = Field(default=1024, ge=1)
    """Longest environment variable name, UTF-8 bytes."""

    max_env_var_value_bytes: int = Field(default=131_071, ge=1)
    """Longest environment variable value (Linux refuses to exec with a ``NAME=value``
    string over 128 KiB: ``MAX_ARG_STRLEN``)."""

    max_env_vars_bytes: int = Field(default=1 << 20, ge=1)
    """Most bytes of a create's environment variables, names and values together (under
    Linux's 2 MiB for a process's arguments and environment together)."""
