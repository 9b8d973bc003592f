"""``aenv scheduler`` and ``aenv gateway``: cluster mode's two stateless services.

Both take the cluster's Redis URL (``--cluster`` or ``AENV_CLUSTER``); any number of each
may run. The gateway also needs a scheduler's URL and the cluster's API key (the nodes'
``AENV_API_KEY``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer

from aenv.cli.common import examples, fail

if TYPE_CHECKING:
    from aenv.cluster.settings import RoleSettings

DEFAULT_SCHEDULER = "127.0.0.1:9090"
DEFAULT_GATEWAY = "127.0.0.1:8080"

Cluster = Annotated[str | None, typer.Option(
    "--cluster", help="the cluster's Redis URL (default AENV_CLUSTER)")]

R = TypeVar("R", bound="RoleSettings")


def _settings(cls: type[R], **options: Any) -> tuple[R, str]:
    """The role's settings (the options given on the command line win) and the cluster's
    Redis URL; an invalid or missing setting is one ``error:`` line."""
    from pydantic import ValidationError

    from aenv.cluster.settings import describe

    # An empty option is not given: a unit file's ``--scheduler ${AENV_SCHEDULER}`` with the
    # variable unset passes "".
    given = {k: v for k, v in options.items() if v is not None and v != ""}
    try:
        settings = cls(**given)
    except ValidationError as exc:
        fail(describe(exc, given))
    if not settings.cluster:
        fail("no cluster: pass --cluster redis://HOST:6379/0 or set AENV_CLUSTER")
    return settings, settings.cluster


def redis_url(cluster: str | None) -> str:
    from aenv.cluster.settings import RoleSettings

    return _settings(RoleSettings, cluster=cluster)[1]


def _serve(app: object, listen: str, log_format: Literal["text", "json"],
           **options: object) -> None:
    import uvicorn

    from aenv.core.log_setup import configure

    configure("info", log_format)
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        fail(f"--listen {listen!r}: expected HOST:PORT")
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="info",  # type: ignore[arg-type]
                access_log=False, log_config=None, **options)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("aenv scheduler --cluster redis://10.0.0.2:6379/0",
                                "AENV_CLUSTER=redis://redis:6379/0 aenv scheduler "
                                "--listen 0.0.0.0:9090"))(scheduler)
    app.command(epilog=examples("aenv gateway --cluster redis://10.0.0.2:6379/0 "
                                "--scheduler http://10.0.0.3:9090"))(gateway)


def scheduler(
    cluster: Cluster = None,
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve on")] = DEFAULT_SCHEDULER,
    key_quota: Annotated[int | None, typer.Option(
        min=0, help="sandboxes (running, paused or starting) one API key may hold in the "
                    "whole cluster (default AENV_KEY_QUOTA, else 0: no quota)")] = None,
) -> None:
    """Serve the scheduler: where each new, resumed or forked sandbox goes. Configuration:
    options, AENV_* variables or the TOML file named by AENV_CONFIG (docs/deployment.md)."""
    from aenv.cluster.redis_client import connect
    from aenv.cluster.scheduler import create_app
    from aenv.cluster.settings import SchedulerSettings

    settings, url = _settings(SchedulerSettings, cluster=cluster, key_quota=key_quota)
    _serve(create_app(connect(url), key_quota=settings.key_quota), listen,
           settings.log_format)


def gateway(
    cluster: Cluster = None,
    scheduler: Annotated[str | None, typer.Option(
        help="a scheduler's URL (default AENV_SCHEDULER, else http://127.0.0.1:9090)")] = None,
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve on")] = DEFAULT_GATEWAY,
    api_key: Annotated[str | None, typer.Option(
        help="the cluster's API key (default AENV_API_KEY; unset: not checked here, "
             "the nodes still check it)")] = None,
) -> None:
    """Serve the gateway: the E2B API and sandbox traffic of the whole cluster. Configuration:
    options, AENV_* variables or the TOML file named by AENV_CONFIG (docs/deployment.md)."""
    from aenv.cluster.gateway import create_app
    from aenv.cluster.redis_client import connect
    from aenv.cluster.settings import GatewaySettings
    from aenv.edge.protocol import protocol_class

    settings, url = _settings(GatewaySettings, cluster=cluster, scheduler=scheduler,
                              api_key=api_key)
    # The nodes' limits (AENV_MAX_BODY_BYTES, ...: docs/limits.md) hold at the gateway too.
    tls = ({"ssl_certfile": str(settings.tls_cert_file),
            "ssl_keyfile": str(settings.tls_key_file)} if settings.tls_cert_file else {})
    _serve(create_app(connect(url), settings.scheduler, settings.api_key,
                      limits=settings.body_limits()), listen, settings.log_format,
           http=protocol_class(settings.connection_limits()),
           timeout_keep_alive=settings.idle_timeout_s,
           timeout_graceful_shutdown=settings.shutdown_grace_s, **tls)
