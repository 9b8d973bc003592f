"""The node's own settings: home, listen address, runtime, cluster membership, TLS, logs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from aenv.core.settings.section import Section


class NodeSettings(Section):
    """The node: where it keeps its state, where it listens, its runtime, its cluster, its logs."""

    home: Path = Path("/var/lib/aenv")
    """State directory: database, layers, sandboxes' writable layers, runsc state, API key."""

    listen: str = "127.0.0.1:3000"
    """Address and port of the API and proxy (``host:port``)."""

    api_key: str | None = None
    """Key clients must send as ``X-API-KEY``. Unset: one is generated (``e2b_<40 hex>``),
    stored in ``<home>/api_key`` and printed at start."""

    runtime: Literal["gvisor", "fake"] = "gvisor"
    """Sandbox runtime driver (``runtime/registry.py``). ``gvisor``: runsc sandboxes. ``fake``:
    no sandbox processes; each sandbox is kept in memory with a fake guest answering envd's
    control endpoints in its network slot, so a node runs its whole control plane (create,
    pause, resume, fork, kill, pools, template images) without runsc; no command runs inside
    (tests of the control plane; needs root like any node)."""

    runsc_platform: Literal["systrap", "ptrace"] = "ptrace"
    """gVisor's platform (how the sentry traps the guest's system calls). ``ptrace``: an idle
    sandbox costs ~0 % of a core and ~18 MiB less than on ``systrap``, whose stubs and sentry
    poll ~1,700 times a second (~2-5 % of a core per idle sandbox); on this kind of VM ptrace
    also ran commands faster (docs/lifecycle.md, *Limits*). On hosts where system calls are
    cheap, systrap may run busy sandboxes faster: measure. Memory images are tied to the
    platform that took them (a node takes its template images again)."""

    cluster: str | None = None
    """Redis URL of the cluster this node joins (``redis://host:6379/0``; ``--cluster`` of
    ``aenv server``). Unset: a standalone node. Joined, the node sends a heartbeat every
    ``heartbeat_interval_s`` (capacity, load, caches, the sandboxes it runs) that schedulers
    place by; see docs/architecture.md, ``cluster/``."""

    advertise: str | None = None
    """The base URL other cluster members reach this node at (``http://10.0.0.5:3000``).
    Unset: ``http://`` + ``listen`` (a wildcard listen address is then refused)."""

    node_id: str | None = None
    """This node's name in the cluster. Unset: kept in ``<home>/node_id``, made once."""

    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    """Seconds between the node's heartbeats to the cluster; a scheduler takes a node that
    missed three for suspect (no placements), ten for lost."""

    peer_fetch: bool = False
    """Cluster mode: fetch a repository blob this node lacks (a layer, a memory image, a disk
    chunk) from another ready node that has it before the shared repository (issue 13's
    peer fetch; every blob is checked against its digest, and any failure falls back to the
    repository). Off: blobs come from the repository only."""

    envd_bundle: Path | None = None
    """envd bundle directory mounted into sandboxes. Unset: ``<home>/envd-bundle``, built on
    first start."""

    envd_ready_timeout_s: float = Field(default=30.0, gt=0)
    """How long a create waits for envd to answer before failing."""

    sandbox_domain: str | None = None
    """Returned as ``domain`` to clients (shapes ``get_host``); unset means the SDK default."""

    tls_listen: str | None = None
    """Where the node also serves its API and proxy over HTTPS (``0.0.0.0:443``), with
    ``tls_cert_file``: sandbox hostnames as E2B serves them, ``https://{port}-{id}.{domain}``
    (``sandbox_domain`` names the domain; docs/deployment.md, "HTTPS hostnames"). Unset: HTTP
    on ``listen`` only."""

    tls_cert_file: Path | None = None
    """The certificate (PEM, chain included) of the HTTPS listener: a wildcard for
    ``*.<sandbox_domain>`` and the API's own name."""

    tls_key_file: Path | None = None
    """The certificate's private key (PEM)."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Server log level."""

    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per log line (time, level, logger, message, the request's id
    from ``X-Request-Id`` or made, an exception if any), for a log pipeline."""

    memory_merge: bool = False
    """Let the kernel merge identical memory pages of the sandboxes' host processes (KSM): the
    node opts itself and every runsc process it starts in (``prctl(PR_SET_MEMORY_MERGE)``)
    and turns ``/sys/kernel/mm/ksm/run`` on (host-wide, and left on at shutdown). Measured
    (docs/density.md): an idle fork child 40.4 → 38.2 MiB, +6 % of them in the same memory,
    for ~1.4 % of a core of ksmd; gVisor's guest memory (a memfd) is never merged. Off by
    default: the gain is small, and pages merged between sandboxes of different users are a
    known side channel (a write to a merged page takes measurably longer)."""

    code_interpreter: bool = True
    """Build the built-in ``code-interpreter-v1`` template (what E2B's ``e2b-code-interpreter``
    SDKs create) in the background at start when it is missing or its recipe changed
    (docs/interpreter.md): a few minutes once, downloading ~150 MB from PyPI and npm and ~60 MB
    of R's packages from the base template's Debian mirror; cached afterwards. Off: that
    template is only there if built some other way."""

    crash_at: str | None = None
    """Testing only: the server kills itself (SIGKILL) when it reaches this step
    (``step`` or ``step:N``; the steps are listed in docs/repository.md)."""

    @model_validator(mode="after")
    def _tls_whole(self) -> Self:
        given = (self.tls_listen, self.tls_cert_file, self.tls_key_file)
        if any(v is not None for v in given) and not all(v is not None for v in given):
            raise ValueError("tls_listen, tls_cert_file and tls_key_file go together")
        if self.tls_listen is not None and not self.tls_listen.rpartition(":")[2].isdigit():
            raise ValueError("tls_listen is host:port")
        return self

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0] or "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])
