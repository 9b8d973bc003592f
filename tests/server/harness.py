"""Start a real aenv node server for tests: its own AENV_HOME, a free port, real gVisor.

The base template is built once per machine into a shared cache (``AENV_TEST_CACHE``, default
``/var/cache/aenv-test``) and shared by every test server through ``AENV_LAYERS_DIR``; the envd
bundle is built once into ``build/envd-bundle``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from e2b import Sandbox

from aenv.core.errors import FailedPrecondition
from aenv.core.locks import lock_slot_range
from tests.conftest import free_port, slot_base

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("AENV_TEST_CACHE", "/var/cache/aenv-test"))
BUNDLE = REPO / "build" / "envd-bundle"
API_KEY = "e2b_" + "0123456789abcdef" * 2 + "01234567"


@dataclass
class NodeServer:
    port: int
    home: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    #: The address it listens on: loopback, or its own in a network namespace of its own.
    host: str = "127.0.0.1"
    #: Where this process's lines begin in the log (a restart on a home appends to it).
    log_from: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        """Crash the server (the sandboxes it started must survive)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after 30 s; False when it took the SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()
                return False
        return True


def client_env(server: NodeServer) -> dict[str, str]:
    return {
        "E2B_API_KEY": API_KEY,
        "E2B_API_URL": server.url,
        "E2B_SANDBOX_URL": server.url,
        "E2B_VOLUME_API_URL": server.url,
        "E2B_DOMAIN": "aenv.test",
    }


def wait_healthy(server: NodeServer, timeout: float = 600.0) -> None:
    """Until ``server`` answers ``/health`` — and it is this process that answers: its own
    log says it bound the port (a port another process held once gave a test another
    shard's node, whose answers looked healthy)."""
    deadline = time.monotonic() + timeout
    bound = f"running on http://{server.host}:{server.port} "
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200 and bound in server.log()[server.log_from:]:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not healthy after {timeout}s:\n{server.log()[-3000:]}")


_servers_started = 0
#: Slot ranges of 100 per test session (see ``_slot_range``).
RANGES = 100


def _slot_range() -> dict[str, str]:
    """A network slot range of its own for each test server: two servers sharing slots would
    sweep each other's network namespaces at start."""
    global _servers_started
    # 100 ranges of 100 slots per test session, reused in turn: more than a whole suite starts
    # servers (~60), so a range comes round again only in a longer session. A server on a range
    # still in use (a session-scoped node) is refused by the slot lock, so wrapping onto a live
    # one fails loudly; what a killed one left in its range the next one's sweep takes.
    # AENV_TEST_SLOT_BASE: a block of 10,000 slots of one's own (parallel test sessions); the
    # default blocks end below 60,000 (tests/network uses 61,000 and up).
    for _ in range(RANGES):
        first = slot_base() + (_servers_started % RANGES) * 100
        _servers_started += 1
        try:
            # Free now (no live node holds any of it): this process holds no slot lock of
            # its own, so taking and closing one here releases nothing of anyone's.
            lock_slot_range(first, first + 99).release()
        except FailedPrecondition:
            continue
        except OSError:
            pass  # no lock file to take (not root: no node starts anyway)
        return {"net_first_index": str(first), "net_last_index": str(first + 99)}
    raise RuntimeError(f"every slot range of this session's block ({slot_base()}..) is held")


#: Memory images of the base template that earlier test servers made, as a posix repository
#: (``manifests/``, ``blobs/sha256/``): a fresh test home gets hard links to them, so its
#: server finds its template image instead of booting, warming and checkpointing the template
#: again (~3-7 s of every server start). Only the base template's; ids name what the image is
#: made of, so a server that needs another (another platform, workspace mode) makes and adds it.
SEED = CACHE / "repository-seed"
_SEEDED = "tpl-base-*.json"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dst)


def _copy_images(src: Path, dst: Path, *, only_new: bool) -> None:
    """The seeded template manifests of repository ``src`` and their blobs into ``dst``
    (blobs first, the manifest last: a reader never sees a manifest without its blobs)."""
    for manifest in sorted((src / "manifests").glob(_SEEDED)):
        target = dst / "manifests" / manifest.name
        if only_new and target.exists():
            continue
        for digest in set(_DIGEST.findall(manifest.read_text())):
            blob = src / "blobs" / "sha256" / digest
            if blob.is_file():
                _link_or_copy(blob, dst / "blobs" / "sha256" / digest)
        _link_or_copy(manifest, target)


def start_server(port: int, home: Path | None = None, *, netns: str | None = None,
                 host: str = "127.0.0.1", **settings: str) -> NodeServer:
    """Start a server; restarting on an existing ``home`` must pass the same slot range.

    ``netns``: run it in that named network namespace (only the network: it shares the
    host's mounts, so its sandboxes' mounts are where the tests look), listening on ``host``.
    """
    fresh = home is None
    home = home or Path(tempfile.mkdtemp(prefix="aenv-home-"))
    # A node with a repository of its own (S3) makes its template image there.
    seeded = fresh and "repository" not in settings
    if seeded and SEED.is_dir():
        _copy_images(SEED, home / "repository", only_new=False)
    # AENV_TEST_WORKSPACE=memory|disk: the workspace mode of every server a test does not
    # give one (the suite runs in both).
    mode = os.environ.get("AENV_TEST_WORKSPACE")
    # Pre-created sandboxes cost every server start ~0.1 s of CPU each: only the tests of
    # the pool ask for them. So do paused sandboxes kept ready to resume: the tests of the
    # disk tier see a paused sandbox's runtime freed (``test_resume_ready.py`` turns it on).
    # The code-interpreter template is built only by the tests of it (a few minutes, once).
    # A restart passes its range: it takes no new one (restarts counted as new ranges came
    # round to the first range within one shard, next to a node maybe still running there).
    slots = {} if "net_first_index" in settings else _slot_range()
    if "slot_count" in settings:  # fewer slots than the range's 100 (tests of slot pressure)
        first = int({**slots, **settings}["net_first_index"])
        count = int(settings.pop("slot_count"))
        slots["net_last_index"] = settings["net_last_index"] = str(first + count - 1)
    settings = {**slots, "precreate_pool_size": "0", "resume_ready_size": "0",
                "code_interpreter": "false",
                **({"workspace": mode} if mode else {}), **settings}
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))},
        "AENV_HOME": str(home),
        "AENV_LISTEN": f"{host}:{port}",
        "AENV_API_KEY": API_KEY,
        "AENV_LAYERS_DIR": str(CACHE / "layers"),
        "AENV_ENVD_BUNDLE": str(BUNDLE),
        "AENV_LOG_LEVEL": "info",
        **{f"AENV_{k.upper()}": v for k, v in settings.items()},
    }
    log_path = home / "server.log"
    log_from = len(log_path.read_text(errors="replace")) if log_path.exists() else 0
    with open(log_path, "ab") as log:
        enter = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
        process = subprocess.Popen(
            [*enter, sys.executable, "-m", "aenv.server"], env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=log, start_new_session=True, cwd=REPO,
        )
    server = NodeServer(port, home, process, log_path, env, host, log_from)
    try:
        wait_healthy(server)
    except BaseException:
        # A server that never came up leaves nothing behind (its pool may be mounted); its
        # log is kept by cleanup_home.
        server.kill9()
        kill_leaked(home)
        if fresh:
            cleanup_home(home)
        raise
    if seeded:
        _copy_images(home / "repository", SEED, only_new=True)
    return server


def prepare_shared_caches() -> None:
    """Fill what test servers share and make on first use — the base template's layers
    (``AENV_LAYERS_DIR``) and its memory image (:data:`SEED`) — by starting one server and
    stopping it, before test processes that would all build them at once start."""
    node = start_server(free_port())
    try:
        node.stop()
    finally:
        kill_leaked(node.home)
        cleanup_home(node.home)


def leaked_sandboxes(home: Path) -> list[int]:
    """PIDs of runsc processes still running for ``home`` (should be none after a stop that
    followed killing every sandbox: the warm pool must clean up after itself)."""
    marker = f"--root={home}/runtime/runsc"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def runsc_of(home: Path, sandbox_id: str) -> list[int]:
    """PIDs of ``home``'s runsc processes of one sandbox (its id is in their command line)."""
    found = []
    for pid in leaked_sandboxes(home):
        try:
            if sandbox_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def kill_leaked(home: Path) -> list[int]:
    pids = leaked_sandboxes(home)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def cleanup_home(home: Path) -> None:
    """Remove a test server's home, keeping its log at /tmp/aenv-test-logs/ for post-mortems.

    Whatever is still mounted under it (a disk-workspace pool, a rootfs a crash left) is
    detached first: deleting through a mount would delete what it shows, and a loop-mounted
    pool would keep its loop device."""
    log = home / "server.log"
    if log.exists():
        keep = Path("/tmp/aenv-test-logs")
        keep.mkdir(exist_ok=True)
        shutil.copy(log, keep / f"{home.name}.log")
    prefix = str(home.resolve()) + "/"
    mounted = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
               if line.split()[1].startswith(prefix)]
    for mount_point in sorted(mounted, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=False, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)


def kill_all_sandboxes() -> None:
    """Kill every sandbox the SDK's environment points at (at once: each kill waits ~1 s for
    the host to reap the sandbox's processes)."""
    paginator = Sandbox.list()
    ids: list[str] = []
    while paginator.has_next:
        ids.extend(info.sandbox_id for info in paginator.next_items())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(Sandbox.kill, ids))


def restore_environ(saved: dict[str, str | None]) -> None:
    """Put back environment variables as they were (``None``: it was not set)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


#: The nodes of :func:`serving` still running, oldest first.
_live: list[NodeServer] = []


def newest(nodes: list[NodeServer]) -> NodeServer | None:
    """Of ``nodes``, the one started last by :func:`serving` and still serving."""
    live = [n for n in nodes if n in _live]
    return max(live, key=_live.index) if live else None


@contextlib.contextmanager
def serving(**settings: str) -> Iterator[NodeServer]:
    """A node server with ``settings``, the SDK's environment pointed at it meanwhile; at the
    end every sandbox is killed, the server stopped, and no runsc process may outlive it."""
    node = start_server(free_port(), **settings)
    saved = {k: os.environ.get(k) for k in (*client_env(node), "E2B_DEBUG")}
    os.environ.update(client_env(node))
    os.environ.pop("E2B_DEBUG", None)
    _live.append(node)
    try:
        yield node
    finally:
        try:
            os.environ.update(client_env(node))  # a later node may have taken the SDK
            kill_all_sandboxes()
        finally:
            stopped = node.stop()
            leaked = kill_leaked(node.home)
            _live.remove(node)
            if _live:
                # Scopes need not nest (a session node started inside a module's): the SDK
                # goes back to the newest node still serving, not to what was set before us.
                os.environ.update(client_env(_live[-1]))
                os.environ.pop("E2B_DEBUG", None)
            else:
                restore_environ(saved)
            if not stopped or leaked:
                # Its home goes next: what it was doing at the end is said here or nowhere.
                why = ("did not stop within 30 s of SIGTERM" if not stopped
                       else f"left runsc processes {leaked}")
                print(f"server {why}; its log's end:\n" + node.log()[-12000:])
            elif "Traceback" in node.log():
                print("server log contains tracebacks:\n" + node.log()[-8000:])
            cleanup_home(node.home)
            assert not leaked, f"runsc processes outlived the server: {leaked}"
