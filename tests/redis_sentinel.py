"""A Redis Sentinel group for tests: a master, a replica and three sentinels (quorum 2), all
Debian's ``redis-server`` (``--sentinel`` mode for the sentinels) on loopback ports.

Failover is quick on purpose (a master is down after 1 s without answers); production values
are in docs/deployment.md.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from tests.conftest import free_port
from tests.redis_server import REDIS_BIN, RedisServer

MASTER_NAME = "aenv"
QUORUM = 2


@dataclass
class SentinelGroup:
    master: RedisServer
    replica: RedisServer
    sentinel_ports: list[int]
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def current_master(self) -> tuple[str, int] | None:
        """The master the sentinels name now (by the first that answers)."""
        for port in self.sentinel_ports:
            with contextlib.suppress(OSError, Exception):
                client = Redis(host="127.0.0.1", port=port, socket_timeout=1,
                               decode_responses=True)
                try:
                    host, master_port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                    return str(host), int(master_port)
                finally:
                    client.close()
        return None

    def wait_for_master(self, port: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.current_master() != ("127.0.0.1", port):
            if time.monotonic() > deadline:
                raise AssertionError(f"the sentinels name {self.current_master()}, not :{port}")
            time.sleep(0.1)


    def wait_until_failover_is_possible(self, timeout_s: float = 30.0) -> None:
        """The replica is in sync and every sentinel knows it and the other sentinels."""
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if time.monotonic() > deadline:
                raise AssertionError("the sentinel group did not come together")
            time.sleep(0.1)

    def _ready(self) -> bool:
        replica = Redis(host="127.0.0.1", port=self.replica.port, decode_responses=True)
        try:
            if replica.info("replication").get("master_link_status") != "up":
                return False
        finally:
            replica.close()
        for port in self.sentinel_ports:
            client = Redis(host="127.0.0.1", port=port, decode_responses=True)
            try:
                fields = client.sentinel_master(MASTER_NAME)
                if fields["num-slaves"] < 1 or fields["num-other-sentinels"] < 2:
                    return False
            finally:
                client.close()
        return True


def _sentinel(root: Path, port: int, master_port: int) -> subprocess.Popen[bytes]:
    assert REDIS_BIN is not None
    conf = root / f"sentinel-{port}.conf"  # sentinels rewrite their file: one each
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {root}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
        f"sentinel failover-timeout {MASTER_NAME} 5000\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n")
    log = open(root / f"sentinel-{port}.log", "ab")  # noqa: SIM115 (the child holds it)
    with log:
        return subprocess.Popen([REDIS_BIN, str(conf), "--sentinel"], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def sentinel_group() -> Iterator[SentinelGroup]:
    with tempfile.TemporaryDirectory(prefix="aenv-sentinel-") as tmp:
        root = Path(tmp)
        (root / "master").mkdir()
        (root / "replica").mkdir()
        master = RedisServer(free_port(), root / "master")
        replica = RedisServer(free_port(), root / "replica",
                              extra_args=("--replicaof", "127.0.0.1", str(master.port)))
        group = SentinelGroup(master, replica, [free_port() for _ in range(3)])
        try:
            master.start()
            replica.start()
            group.sentinels = [_sentinel(root, port, master.port)
                               for port in group.sentinel_ports]
            group.wait_for_master(master.port)
            group.wait_until_failover_is_possible()
            yield group
        finally:
            for process in group.sentinels:
                process.kill()
                process.wait()
            replica.kill()
            master.kill()
