"""``aenv scheduler`` and ``aenv gateway``: cluster mode's two stateless services.

Both take the cluster's Redis URL (``--cluster`` or ``AENV_CLUSTER``); any number of each
may run. The gateway also needs a scheduler's URL and the cluster's API key (the nodes'
``AENV_API_KEY``).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from aenv.cli.common import examples, fail

DEFAULT_SCHEDULER = "127.0.0.1:9090"
DEFAULT_GATEWAY = "127.0.0.1:8080"

Cluster = Annotated[str | None, typer.Option(
    "--cluster", help="the cluster's Redis URL (default AENV_CLUSTER)")]


def redis_url(cluster: str | None) -> str:
    url = cluster or os.environ.get("AENV_CLUSTER")
    if not url:
        fail("no cluster: pass --cluster redis://HOST:6379/0 or set AENV_CLUSTER")
    return url


def _serve(app: object, listen: str, **options: object) -> None:
    import uvicorn

    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        fail(f"--listen {listen!r}: expected HOST:PORT")
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="info",  # type: ignore[arg-type]
                access_log=False, **options)  # type: ignore[arg-type]


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
    """Serve the scheduler: where each new, resumed or forked sandbox goes."""
    from aenv.cluster.redis_client import connect
    from aenv.cluster.scheduler import create_app

    if key_quota is None:
        raw = os.environ.get("AENV_KEY_QUOTA", "0")
        if not raw.isdigit():
            fail(f"AENV_KEY_QUOTA={raw!r}: expected a whole number")
        key_quota = int(raw)
    _serve(create_app(connect(redis_url(cluster)), key_quota=key_quota), listen)


def gateway(
    cluster: Cluster = None,
    scheduler: Annotated[str, typer.Option(
        help="a scheduler's URL (default AENV_SCHEDULER, else http://127.0.0.1:9090)")] = "",
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve on")] = DEFAULT_GATEWAY,
    api_key: Annotated[str | None, typer.Option(
        help="the cluster's API key (default AENV_API_KEY; unset: not checked here, "
             "the nodes still check it)")] = None,
) -> None:
    """Serve the gateway: the E2B API and sandbox traffic of the whole cluster."""
    from aenv.cluster.gateway import create_app
    from aenv.cluster.redis_client import connect
    from aenv.core.settings import Settings
    from aenv.edge.limits import BodyLimits
    from aenv.edge.protocol import ConnectionLimits, protocol_class

    scheduler_url = scheduler or os.environ.get("AENV_SCHEDULER") or f"http://{DEFAULT_SCHEDULER}"
    key = api_key or os.environ.get("AENV_API_KEY")
    # The nodes' limits (AENV_MAX_BODY_BYTES, ...: docs/limits.md) hold at the gateway too.
    settings = Settings()
    _serve(create_app(connect(redis_url(cluster)), scheduler_url, key,
                      limits=BodyLimits.of(settings)), listen,
           http=protocol_class(ConnectionLimits.of(settings)),
           timeout_keep_alive=settings.idle_timeout_s)
