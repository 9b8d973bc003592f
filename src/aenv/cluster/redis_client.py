"""The one way cluster mode connects to Redis: text replies, bounded timeouts, and retries
of a dropped connection (a Redis restart or a Sentinel failover closes every connection; the
next command reconnects instead of failing)."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: Seconds a command or a connect may take before it counts as failed.
TIMEOUT_S = 5.0
RETRIES = 3


def connect(url: str) -> Redis:
    return Redis.from_url(
        url, decode_responses=True, socket_timeout=TIMEOUT_S,
        socket_connect_timeout=TIMEOUT_S, health_check_interval=10,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
        retry_on_error=[RedisConnectionError, RedisTimeoutError])
