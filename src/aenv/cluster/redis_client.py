"""The one way cluster mode connects to Redis: text replies, bounded timeouts, and retries
of a dropped connection (a Redis restart or a Sentinel failover closes every connection; the
next command reconnects instead of failing).

URLs: ``redis://[:password@]host:port/db`` (one server), or
``redis+sentinel://[:password@]sentinel1:26379,sentinel2:26379/<master name>/<db>``: the
client asks the sentinels for the current master and follows a failover.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aenv.core.errors import Unavailable

#: Seconds a command or a connect may take before it counts as failed.
TIMEOUT_S = 5.0
RETRIES = 3
SENTINEL_SCHEME = "redis+sentinel"


def _options() -> dict[str, Any]:
    return {
        "decode_responses": True, "socket_timeout": TIMEOUT_S,
        "socket_connect_timeout": TIMEOUT_S, "health_check_interval": 10,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }


def connect(url: str) -> Redis:
    if not url.startswith(SENTINEL_SCHEME + "://"):
        return Redis.from_url(url, **_options())
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    password = unquote(parts.password) if parts.password else None
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(f"{url}: name the master: redis+sentinel://HOSTS/<master>[/<db>]")
    master, db = path[0], int(path[1]) if len(path) > 1 else 0
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        sentinels.append((name, int(port)) if name else (host, 26379))
    # redis < 8.2 leaves Sentinel untyped, 8.2 types it: either is fine.
    sentinel = Sentinel(sentinels, socket_timeout=TIMEOUT_S)  # type: ignore[no-untyped-call, unused-ignore]
    client: Redis = sentinel.master_for(master, db=db, password=password, **_options())
    return client


P = ParamSpec("P")
T = TypeVar("T")
_Method = Callable[P, Coroutine[Any, Any, T]]


def reachable(what: str) -> Callable[[_Method[P, T]], _Method[P, T]]:
    """A decorator: Redis errors of a method as ``Unavailable`` (503) naming ``what`` cannot be
    reached, since callers outside ``cluster/`` know no Redis."""
    def decorate(method: _Method[P, T]) -> _Method[P, T]:
        @functools.wraps(method)
        async def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return await method(*args, **kwargs)
            except RedisError as exc:
                raise Unavailable(f"{what} cannot be reached: {exc}") from exc
        return wrapped
    return decorate
