"""Node configuration: one frozen object, read once in ``main()`` and passed down.

Sources, later wins: defaults < TOML file (``AENV_CONFIG``, default ``/etc/aenv/aenv.toml`` if it
exists) < ``AENV_*`` environment variables. Every field is documented; ``docs/config.md`` is
generated from these docstrings (``python -m aenv.core.settings``). ``os.environ`` is read nowhere
else in aenv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_CONFIG_FILE = Path("/etc/aenv/aenv.toml")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="AENV_", frozen=True, extra="forbid", use_attribute_docstrings=True
    )

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

    default_template: str = "base"
    """Template used when a create request names none."""

    default_timeout_s: int = Field(default=300, ge=1)
    """Sandbox lifetime when the create request gives no ``timeout``."""

    max_timeout_s: int = Field(default=86_400, ge=1)
    """Longest lifetime a client may ask for (create, set_timeout, connect)."""

    default_cpu_count: int = Field(default=2, ge=1)
    """vCPUs of a sandbox (templates may override)."""

    default_memory_mb: int = Field(default=1024, ge=64)
    """Memory limit of a sandbox in MiB (templates may override)."""

    disk_size_mb: int = Field(default=10_240, ge=64)
    """Disk size reported for a sandbox's writable layer, MiB."""

    max_sandboxes: int = Field(default=200, ge=1)
    """Running sandboxes this node accepts before answering 429."""

    max_concurrent_starts: int = Field(default=4, ge=1)
    """Creates starting a sandbox (a restore, or a boot) at once; more wait in line. A restore
    costs ~0.3 s of CPU: four keep two cores busy through each other's waits for envd, where
    a hundred at once would make every one of them take tens of seconds."""

    max_queued_starts: int = Field(default=32, ge=0)
    """Creates waiting for a start; one more is answered 429 at once, with ``Retry-After``.
    Thirty-two behind four starts wait a few seconds, well inside the SDKs' 60 s timeout."""

    busy_retry_after_s: int = Field(default=1, ge=1)
    """``Retry-After`` (seconds) of a create's 429 (the node at its start or sandbox limit). The
    E2B SDKs retry a 429 up to three times after that long, so keep it short."""

    ttl_check_interval_s: float = Field(default=0.5, gt=0)
    """How often expired sandboxes are looked for."""

    net_pool_size: int = Field(default=24, ge=0)
    """Network slots kept prepared ahead of creates (refilled below half): a fork of 16 takes
    16 at once next to the warm pool's, and making one costs 12-40 ms (seconds while 16
    restores share two cores)."""

    warm_pool_size: int = Field(default=2, ge=0)
    """High watermark: sandboxes of the default template restored from its memory image and
    kept ready, so a create only initialises one (milliseconds instead of a restore). Each
    costs an idle sandbox's memory; 0 disables."""

    warm_pool_low: int | None = Field(default=None, ge=0)
    """Low watermark: refilling starts when fewer are ready (then fills up to the high one).
    Unset: refill after every claim."""

    precreate_pool_size: int = Field(default=16, ge=0, le=256)
    """Sandboxes created ahead but not started (network slot, rootfs, runsc's processes), for
    restores of one shape: the last fork's parent (or, before any fork, the default
    template). A fork child or a create the warm pool cannot serve is restored into one in
    ~95 ms instead of ~180 ms. Each costs ~12 MiB and one network slot while it waits; a
    fork of 16 children wants 16. With disk workspaces only template creates use them (a
    fork child's disk does not exist before the fork). 0 disables."""

    code_interpreter: bool = True
    """Build the built-in ``code-interpreter-v1`` template (what E2B's ``e2b-code-interpreter``
    SDKs create) in the background at start when it is missing or its recipe changed
    (docs/interpreter.md): a few minutes once, downloading ~150 MB from PyPI and npm and ~60 MB
    of R's packages from the base template's Debian mirror; cached afterwards. Off: that
    template is only there if built some other way."""

    auto_pause_default: bool = True
    """What a sandbox does at the end of its lifetime when the create request does not say
    (``autoPause``): pause (true; see the state machine in docs/architecture.md) or be killed
    (false; E2B's own default)."""

    pause_hot_s: float = Field(default=10.0, ge=0)
    """A paused sandbox stays frozen in memory this long (resume in milliseconds) before its
    memory is written to disk and freed. 0 writes it at once."""

    max_hot_paused: int = Field(default=8, ge=0)
    """At most this many sandboxes stay frozen in memory; older ones are written out first."""

    volume_default_size_mb: int = Field(default=1024, ge=16)
    """A new volume's size (its quota: a write past it fails with ENOSPC, the content API
    answers 507) when the create request does not say (aenv's ``sizeMB``)."""

    volume_max_size_mb: int = Field(default=100 * 1024, ge=16)
    """The largest volume a create may ask for. Images are sparse: a volume takes host disk
    for what is written in it, not for its size."""

    volume_idle_release_s: float = Field(default=30.0, ge=0)
    """A volume no sandbox of this node mounts and no content request used for this long is
    committed to the repository and released, so another node can take it."""

    volume_token_ttl_s: int = Field(default=3600, ge=60)
    """How long a volume token (``POST /volumes``, ``GET /volumes/{id}``) lets the content API
    be used; the SDKs keep the token of a ``Volume`` object and never refresh it."""

    audit_max_entries: int = Field(default=100_000, ge=100)
    """The audit log (``GET /audit``, ``aenv audit``, docs/audit.md) keeps this many entries,
    the newest; older ones are dropped as new ones are written."""

    observe: bool = True
    """Sandbox logs, lifecycle webhooks, team metrics and the node's gauges (docs/metrics.md).
    Off: none of them is recorded (the logs and metrics routes answer empty), for measuring
    what they cost (``bench.observe_bench``); Prometheus counters and histograms stay."""

    sandbox_log_max_entries: int = Field(default=10_000, ge=100)
    """Each sandbox's logs (E2B's logs API, ``aenv logs``, docs/logs.md) keep about this many
    entries, the newest: lifecycle events and console lines."""

    team_metrics_keep_s: float = Field(default=7 * 86_400.0, ge=3600)
    """Each team's samples (sandboxes up, starts per second: ``GET /teams/{id}/metrics``,
    docs/metrics.md) are kept this long."""

    webhook_allow_private: bool = False
    """Whether lifecycle webhooks (docs/webhooks.md) may be delivered to loopback, private and
    link-local addresses. Off: a team cannot use the node to reach the node's own network."""

    webhook_retry_max_s: float = Field(default=300.0, ge=1)
    """A failed webhook delivery is tried again after 1, 2, 4 … seconds, at most this long
    apart."""

    webhook_give_up_s: float = Field(default=86_400.0, ge=60)
    """A webhook delivery still failing this long after its event is given up (failed in
    its delivery log)."""

    sandbox_log_keep_s: float = Field(default=86_400.0, ge=60)
    """A gone sandbox's logs are kept this long after their last entry, for its team to
    read; then dropped."""

    max_concurrent_spills: int = Field(default=2, ge=1)
    """At most this many frozen sandboxes are written to disk at once; the rest wait their
    turn without holding their sandbox, so a resume of one of them never waits behind a
    spill. Many checkpoints at once on a few cores each take tens of seconds (a resume that
    meets one waits for it)."""

    idle_pause_s: int | None = Field(default=None, ge=1)
    """Idle auto-pause: a running sandbox with no API call naming it and no proxied request or
    open stream for this many seconds is paused (memory kept; resumed by ``connect``, or by
    its next proxied request when created with ``autoResume``). A sandbox's own
    ``aenv.idlePauseSeconds`` metadata wins (``"0"``: never). Unset: off."""

    idle_check_interval_s: float = Field(default=1.0, gt=0)
    """How often idle sandboxes are looked for (an idle pause comes up to this late)."""

    max_fork_count: int = Field(default=100, ge=1, le=1000)
    """Most children one fork request may ask for."""

    idempotency_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a create's ``Idempotency-Key`` is remembered: a repeat with the same key (and
    API key) within this time gets the first create's answer instead of a second sandbox. In
    memory only: a restarted node has forgotten every key (``api/idempotency.py``)."""

    transition_wait_s: float = Field(default=30.0, gt=0)
    """How long an operation on a sandbox (resume, connect, pause, snapshot, fork, a network
    update) waits for its turn while another operation holds the sandbox (a pause being
    written to disk, a snapshot) before answering 409."""

    operation_deadline_s: float = Field(default=300.0, gt=0)
    """The longest any one lifecycle operation on a sandbox (pause, spill, resume, snapshot,
    fork, move) may take; past it the operation is cancelled (504), and the sandbox is put
    back running or paused (docs/lifecycle.md, *The lifecycle model*)."""

    kill_answer_s: float = Field(default=3.0, gt=0)
    """A kill answers once the sandbox is torn down, or after this many seconds while the
    teardown goes on in the background (the sandbox is gone for clients either way)."""

    kill_deadline_s: float = Field(default=120.0, gt=0)
    """The longest a kill's teardown may take; a teardown past it is retried by the TTL
    loop."""

    net_first_index: int = Field(default=1, ge=1, le=65_000)
    """First network slot index this node may use (slots are named ``aenv-<index>``; give
    nodes sharing a machine disjoint ranges)."""

    net_last_index: int = Field(default=30_000, ge=1, le=65_000)
    """Last network slot index this node may use."""

    egress_resolvers: tuple[str, ...] = ()
    """DNS servers the node's egress proxy resolves the names of sandboxes with domain rules
    with (``network.allowOut`` / ``denyOut`` naming domains; docs/security.md). Empty: the
    host's ``/etc/resolv.conf``."""

    identity_issuer: str | None = None
    """The issuer URL of the workload identity tokens sandboxes' egress rules carry (E2B
    ``iam``; docs/teams.md): where verifiers find ``/.well-known/openid-configuration`` and
    the keys, so the public origin of the API (a cluster's gateway). Unset: ``advertise``,
    else ``http://`` + ``listen``."""

    identity_trust_domain: str = "aenv.local"
    """The SPIFFE trust domain in the tokens' subjects (``spiffe://<domain>/team/…``)."""

    egress_upstream_ca_file: Path | None = None
    """PEM CAs the node trusts, besides the host's own, for the hosts whose HTTPS it ends to
    put in a sandbox's ``network.rules`` headers (a private API's CA; docs/security.md,
    "Secrets in requests"). Unset: the host's CAs only."""

    layers_dir: Path | None = None
    """Where template layers live. Unset: ``<home>/layers``. Several homes may share one."""

    insecure_registries: tuple[str, ...] = ()
    """Registries pulled from without TLS verification (``host`` or ``host:port``; plain HTTP if
    they do not speak HTTPS). Loopback registries (``localhost``, ``127.0.0.0/8``, ``::1``) are
    always treated so, as Docker does."""

    registry_auth_file: Path | None = None
    """Credentials for image pulls, in Docker's ``config.json`` format (``{"auths": {"host":
    {"auth": base64("user:password")}}}``). Credentials given with a build request win."""

    registry_cert_dir: Path | None = None
    """Directory of extra TLS files for registries: CA certificates (``*.crt``) and client
    certificate/key pairs (``*.cert``/``*.key``). Unset: the system's trust store."""

    local_image_roots: tuple[Path, ...] = ()
    """Directories from which ``oci:<dir>`` and ``docker-archive:<file>`` image sources may be
    imported (the node reads them as root, so API callers may name only these). Empty: local
    sources are refused; registry references are always allowed."""

    layer_cache_bytes: int = Field(default=100 << 30, ge=0)
    """Disk the layer cache may use for image layers and blobs, in bytes (0: unbounded). Above
    the high watermark, layers no running sandbox uses are evicted, least recently used first,
    down to the low watermark; an evicted layer is fetched again from its image's source when
    next needed. Layers made by template builds are never evicted."""

    layer_cache_high: float = Field(default=0.90, gt=0, le=1)
    """High watermark of the layer cache, as a fraction of ``layer_cache_bytes``."""

    layer_cache_low: float = Field(default=0.75, gt=0, le=1)
    """Low watermark of the layer cache (eviction stops there)."""

    max_layer_bytes: int = Field(default=20 << 30, gt=0)
    """Largest unpacked image layer (logical bytes; a sparse file counts its full size)."""

    max_image_bytes: int = Field(default=50 << 30, gt=0)
    """Largest unpacked image (all layers)."""

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

    build_step_timeout_s: float = Field(default=3600.0, gt=0)
    """How long one RUN step of a template build may take."""

    build_ready_timeout_s: float = Field(default=300.0, gt=0)
    """How long a template's ready command may take to succeed after its start command."""

    runsc_platform: Literal["systrap", "ptrace"] = "ptrace"
    """gVisor's platform (how the sentry traps the guest's system calls). ``ptrace``: an idle
    sandbox costs ~0 % of a core and ~18 MiB less than on ``systrap``, whose stubs and sentry
    poll ~1,700 times a second (~2-5 % of a core per idle sandbox); on this kind of VM ptrace
    also ran commands faster (docs/lifecycle.md, *Limits*). On hosts where system calls are
    cheap, systrap may run busy sandboxes faster: measure. Memory images are tied to the
    platform that took them (a node takes its template images again)."""

    workspace: Literal["memory", "disk"] = "disk"
    """Where a sandbox's written files live. ``disk``: in a disk image of its own of
    ``disk_size_mb`` (writes past it fail with ENOSPC), on a reflink-capable pool under
    ``<home>/workspaces`` (needs loop devices, ``mkfs.xfs`` and ``mkfs.ext4``); ``/tmp`` stays
    in memory. ``memory``: inside the sandbox's memory (part of every memory image; bounded by
    its memory limit); for hosts without loop devices (docs/workspaces.md)."""

    workspace_pool_bytes: int = Field(default=0, ge=0)
    """Size of the workspace pool image made when ``<home>/workspaces`` cannot reflink
    (0: 80% of the free space of the home's filesystem, at most 1 TiB)."""

    workspace_overcommit: float | None = Field(default=None, ge=1.0)
    """How many times the pool's size the disks of its sandboxes may add up to (their
    ``disk_size_mb`` each). Unset: no bound on that sum (images are sparse and hold only what
    was written); creates, forks and snapshots are refused while less than a twentieth of the
    pool is really free. 1: a full pool is impossible, at one full disk per sandbox. Between,
    and unset, sandboxes that all fill their disks at once can fill the pool, and their next
    writes fail with I/O errors (docs/workspaces.md)."""

    host_disk_watermark_percent: float = Field(default=90.0, gt=0, le=100)
    """Disk workspaces: above this usage (``df``'s ``Use%``) of the host file system holding
    the workspace pool (the home's, for a pool image), creates, resumes, forks, snapshots and
    disk growths are refused with 429 and ``Retry-After``, so the sandboxes already running
    keep the rest to write into. 100: never refused (docs/workspaces.md)."""

    workspace_trim_interval_s: float = Field(default=5.0, ge=0)
    """Disk workspaces on a pool image: how often the image is checked for blocks freed in the
    pool (deleted files and images) that the host has not got back yet, and trimmed if so.
    0: trimmed only after a kill or pause; XFS then returns the rest within ~30 s by itself."""

    repository: str | None = None
    """Where snapshots, templates and paused sandboxes are kept, shared by every node that
    names the same place: a directory (``posix_fs``; local or a shared mount) or
    ``s3://BUCKET/PREFIX`` (any S3-compatible store; endpoint, region and credentials below).
    Unset: ``<home>/repository``."""

    s3_endpoint: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_endpoint", "AENV_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    """S3 endpoint URL (e.g. ``http://minio:9000``); also read from ``AWS_ENDPOINT_URL``.
    Unset: AWS."""

    s3_region: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_region", "AENV_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"))
    """S3 region; also read from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``."""

    s3_access_key_id: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_access_key_id", "AENV_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"))
    """S3 access key; also read from ``AWS_ACCESS_KEY_ID``."""

    s3_secret_access_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices(
        "s3_secret_access_key", "AENV_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"))
    """S3 secret key; also read from ``AWS_SECRET_ACCESS_KEY``."""

    s3_allow_http: bool = Field(default=False, validation_alias=AliasChoices(
        "s3_allow_http", "AENV_S3_ALLOW_HTTP", "AWS_ALLOW_HTTP"))
    """Allow a plain-HTTP S3 endpoint; also read from ``AWS_ALLOW_HTTP``."""

    s3_virtual_hosted: bool = Field(default=False, validation_alias=AliasChoices(
        "s3_virtual_hosted", "AENV_S3_VIRTUAL_HOSTED", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
    """Virtual-hosted addressing (``BUCKET.endpoint``) instead of path style."""

    repository_cache_bytes: int = Field(default=50 << 30, ge=0)
    """Disk this node may use for its copies of repository blobs (memory images, layer and
    bundle tarballs), in bytes (0: unbounded); least recently used ones are dropped beyond it
    and fetched again when needed."""

    gc_interval_s: float = Field(default=3600.0, ge=0)
    """How often this node collects the repository's garbage (blobs no committed snapshot,
    template or paused sandbox names). 0: never (another node does it)."""

    gc_grace_s: float = Field(default=3600.0, ge=0)
    """A blob without a manifest is kept this long: a commit in flight on any node writes its
    blobs before its manifest. Longer than the slowest commit."""

    crash_at: str | None = None
    """Testing only: the server kills itself (SIGKILL) when it reaches this step
    (``step`` or ``step:N``; the steps are listed in docs/repository.md)."""

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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return config_sources(settings_cls, init_settings, env_settings)

    @model_validator(mode="after")
    def _tls_whole(self) -> Settings:
        given = (self.tls_listen, self.tls_cert_file, self.tls_key_file)
        if any(v is not None for v in given) and not all(v is not None for v in given):
            raise ValueError("tls_listen, tls_cert_file and tls_key_file go together")
        if self.tls_listen is not None and not self.tls_listen.rpartition(":")[2].isdigit():
            raise ValueError("tls_listen is host:port")
        return self

    def repository_location(self) -> str:
        """The repository setting, with its default filled in."""
        return self.repository or str(self.home / "repository")

    def s3_options(self) -> dict[str, Any]:
        """The S3 connection options, as ``storage.objects.S3Location`` takes them."""
        secret = self.s3_secret_access_key
        return {
            "endpoint": self.s3_endpoint, "region": self.s3_region,
            "access_key_id": self.s3_access_key_id,
            "secret_access_key": secret.get_secret_value() if secret else None,
            "allow_http": self.s3_allow_http, "virtual_hosted": self.s3_virtual_hosted,
        }

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0] or "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def load(**overrides: Any) -> Settings:
    return Settings(**overrides)


def reference_markdown() -> str:
    """The configuration reference, generated from the field docstrings."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `src/aenv/core/settings.py` by `python -m aenv.core.settings`.",
        "Set keys in the TOML file named by `AENV_CONFIG` (default `/etc/aenv/aenv.toml`) or as",
        "environment variables `AENV_<KEY>` (upper case), which win over the file.",
        "",
        "| key | env | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default if field.default is not None else ""
        doc = " ".join((field.description or "").split())
        lines.append(f"| `{name}` | `AENV_{name.upper()}` | `{default}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())


def config_sources(settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                   env_settings: PydanticBaseSettingsSource
                   ) -> tuple[PydanticBaseSettingsSource, ...]:
    """Arguments, then ``AENV_*``, then the ``AENV_CONFIG`` TOML file if it exists: the order
    every aenv role's settings read (node, gateway, scheduler)."""
    config_file = Path(os.environ.get("AENV_CONFIG", DEFAULT_CONFIG_FILE))
    sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
    if config_file.is_file():
        sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
    return tuple(sources)
