"""OpenEnv on aenv: one prepared parent per environment image, a fork child per episode.

Use::

    envs = AenvOpenEnv(dockerfiles={"question-env": ("env_dir", "env_dir/Dockerfile")})
    client = QuestionEnv.from_docker_image("question-env", provider=envs.provider()).sync()
    ...
    client.close()      # OpenEnv calls provider.stop_container(): the child is killed
    envs.close()        # the prepared parents, and everything else of the run

OpenEnv's ``ContainerProvider`` (``openenv.core.containers.runtime.providers``) runs one
environment server per client. :class:`AenvProvider` is that interface, one instance per
client (OpenEnv keeps one container handle per provider); every provider of one
:class:`AenvOpenEnv` shares its client, templates and parents:

* ``start_container(image)`` maps ``image`` to a template: a name in ``dockerfiles`` is built
  from its Dockerfile once (template ``openenv-<hash of the context>``, reused when the node
  has it); else a template of that name; else a registry image, built with ``from_image``.
  The first episode of a template prepares its parent through :mod:`aenv.rl`
  (``RolloutPool.prepare``: the template's start command, e.g. its ``CMD``, runs the env
  server; ``start_cmd`` starts it otherwise; the parent is ready once ``/health`` answers).
  Each episode is a fork child of that parent, so the server is already up in it. Forks asked
  for at once are served by one fork call (a parent forks one batch at a time).
* The base URL is a loopback port of this process, one per child, forwarding to the node's
  proxy with the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers added. OpenEnv's client
  takes a URL and no headers (``from_docker_image`` passes none), and the e2b host form
  (``8000-<id>.<domain>``) needs wildcard DNS for the domain, which a loopback node lacks.
  The forwarder relays bytes: HTTP (one request per connection, ``Connection: close``) and
  the WebSocket OpenEnv's client speaks (``/ws``).
* ``wait_for_ready`` polls ``GET /health`` through that URL; ``stop_container`` kills the child.

Owns, per :class:`AenvOpenEnv`: one :class:`aenv.client.sync.Client` (run label
``run=<run id>`` on every sandbox; its loop thread runs the forwarders), one
:class:`aenv.rl.RolloutPool` (label ``rl_pool=<id>``; it holds the parents and children), the
templates it built, and the forwarders' listening sockets. Nothing else. What a crash leaves:
the templates (reused by the next run); the sandboxes, labelled ``run=<run id>`` and ended by
the client's exit handlers, ``aenv kill --metadata run=<run id>``, or their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shlex
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from e2b import AsyncTemplate
from openenv.core.containers.runtime.providers import ContainerProvider

from aenv.client import InfrastructureError, Sandbox
from aenv.client.sync import Client
from aenv.rl import RolloutPool, Task

log = logging.getLogger("aenv.integrations.openenv")

#: OpenEnv's servers listen on 8000 (its Dockerfiles' ``uvicorn ... --port 8000``).
ENV_PORT = 8000
#: A parent lives for the run; an episode for at most this long (the pool kills it sooner).
SANDBOX_TIMEOUT_S = 3600
#: How long the parent's env server may take to answer ``/health`` (a cold uvicorn import of
#: FastAPI, pydantic and fastmcp under gVisor on a loaded host).
SERVER_START_TIMEOUT_S = 120
#: A request head larger than this is not an HTTP request we forward.
_MAX_HEAD = 64 * 1024
_CHUNK = 1 << 16


def template_name(context_dir: Path, dockerfile: Path) -> str:
    """``openenv-`` + a hash of the build context's files and the Dockerfile: equal
    environments share a template, a changed one gets a new one."""
    digest = hashlib.sha256(dockerfile.read_bytes())
    for path in sorted(p for p in context_dir.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(context_dir)).encode() + b"\0" + path.read_bytes())
    return "openenv-" + digest.hexdigest()[:24]


@dataclass
class _Image:
    """An image's template and its pending fork requests."""

    task: Task
    waiting: list[asyncio.Future[Sandbox]] = field(default_factory=list)
    forker: asyncio.Task[None] | None = None


class AenvOpenEnv:
    """The shared half: client, pool, templates, parents, forwarders; see the module docstring.

    ``dockerfiles``: image name → ``(context dir, Dockerfile)`` built into a template.
    ``start_cmd``: run in the background in each parent, for templates whose start command
    does not start the env server. ``run_id``: the run label (generated when None)."""

    def __init__(self, *, dockerfiles: dict[str, tuple[str | Path, str | Path]] | None = None,
                 port: int = ENV_PORT, start_cmd: str | None = None,
                 run_id: str | None = None, client: Client | None = None,
                 sandbox_timeout_s: int = SANDBOX_TIMEOUT_S) -> None:
        self.client = client if client is not None else Client(run_id=run_id)
        self._own_client = client is None
        self.port = port
        self.start_cmd = start_cmd
        self.sandbox_timeout_s = sandbox_timeout_s
        self.dockerfiles = {name: (Path(ctx), Path(df))
                            for name, (ctx, df) in (dockerfiles or {}).items()}
        self.pool: RolloutPool = self.client.run_async(self._make_pool())
        self._images: dict[str, _Image] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Builds run one at a time: images that share their leading steps (the usual case: one
        #: environment, a file per task) build those once and find them cached the next time.
        self._build_lock = asyncio.Lock()
        self._servers: dict[str, asyncio.Server] = {}
        #: Templates this object built, and parents and children it started (tests, logs).
        self.built: list[str] = []
        self.parents: list[str] = []
        self.children: list[str] = []
        self._closed = False

    @property
    def run_id(self) -> str:
        return self.client.aio.run_id

    def provider(self) -> AenvProvider:
        """A provider for one OpenEnv client (pass it to ``from_docker_image``)."""
        return AenvProvider(self)

    def close(self) -> None:
        """Stop the forwarders, kill the parents and every sandbox of the pool and run."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.run_async(self._aclose())
        finally:
            if self._own_client:
                self.client.close()

    def __enter__(self) -> AenvOpenEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the client's loop --

    async def _make_pool(self) -> RolloutPool:
        # Forks of the running parent, whose env server (the template's start command)
        # each episode's child carries as it runs now.
        return RolloutPool(self.client.aio, rollout_timeout_s=self.sandbox_timeout_s,
                           branch_from="parent")

    async def start(self, image: str) -> tuple[Sandbox, str]:
        """A fork child of ``image``'s prepared parent and its base URL."""
        if self._closed:
            raise RuntimeError("AenvOpenEnv is closed")
        entry = await self._image(image)
        await self.pool.prepare(entry.task)
        future: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        entry.waiting.append(future)
        if entry.forker is None:
            entry.forker = asyncio.create_task(self._fork_waiting(entry))
        child = await future
        try:
            url = await self._forward(child.sandbox_id)
        except BaseException:
            await asyncio.shield(self.pool.kill(child))
            raise
        self.children.append(child.sandbox_id)
        log.info("openenv %s: episode %s at %s", image, child.sandbox_id, url)
        return child, url

    async def stop(self, child: Sandbox) -> None:
        server = self._servers.pop(child.sandbox_id, None)
        if server is not None:
            server.close()
        await self.pool.kill(child)

    async def _image(self, image: str) -> _Image:
        lock = self._locks.setdefault(image, asyncio.Lock())
        async with lock:
            if image not in self._images:
                name = await self._template(image)
                self._images[image] = _Image(self._task(name))
            return self._images[image]

    def _task(self, template: str) -> Task:
        health = f"curl -sf http://127.0.0.1:{self.port}/health >/dev/null"
        wait = (f"for i in $(seq {SERVER_START_TIMEOUT_S * 2}); do {health} && exit 0; "
                f"sleep 0.5; done; echo 'the env server never answered /health' >&2; exit 1")
        setup = [wait]
        if self.start_cmd is not None:
            setup.insert(0, f"nohup sh -c {shlex.quote(self.start_cmd)} "
                            f">/tmp/openenv-server.log 2>&1 &")
        # The diff baseline covers an empty directory: an episode's state is the server's.
        return Task(template=template, setup=tuple(setup), workdir="/tmp",
                    diff_roots=("/tmp/.aenv-openenv",), timeout_s=self.sandbox_timeout_s,
                    setup_timeout_s=SERVER_START_TIMEOUT_S + 30)

    async def _template(self, image: str) -> str:
        params = self._sdk_params()
        if image in self.dockerfiles:
            context, dockerfile = self.dockerfiles[image]
            name = await asyncio.to_thread(template_name, context, dockerfile)
            definition = AsyncTemplate(file_context_path=str(context)).from_dockerfile(
                str(dockerfile))
        elif await AsyncTemplate.exists(image, **params):
            return image
        else:
            name = "openenv-" + hashlib.sha256(image.encode()).hexdigest()[:24]
            definition = AsyncTemplate().from_image(image)
        async with self._build_lock:
            if not await AsyncTemplate.exists(name, **params):
                log.info("building template %s for %s", name, image)
                await AsyncTemplate.build(
                    definition, name,
                    on_build_logs=lambda entry: log.debug("%s: %s", name, entry), **params)
                self.built.append(name)
        return name

    async def _fork_waiting(self, entry: _Image) -> None:
        """Serve the waiting fork requests in batches (one fork call each) until none is left."""
        try:
            while entry.waiting:
                batch, entry.waiting = entry.waiting, []
                try:
                    forked = await self.pool.fork(entry.task, len(batch))
                    children, errors = list(forked), list[BaseException](forked.errors)
                except Exception as exc:
                    children, errors = [], [exc]
                prepared = await self.pool.prepare(entry.task)
                if prepared.sandbox_id not in self.parents:
                    self.parents.append(prepared.sandbox_id)
                for future in batch:
                    if future.cancelled():
                        continue
                    if children:
                        future.set_result(children.pop())
                    else:
                        future.set_exception(errors[0] if errors else InfrastructureError(
                            f"fork of {prepared.sandbox_id} gave too few children"))
                for orphan in children:  # asked for by a start that was cancelled meanwhile
                    await self.pool.kill(orphan)
        finally:
            entry.forker = None

    async def _forward(self, sandbox_id: str) -> str:
        """A loopback listener relaying to the node's proxy for ``sandbox_id``'s port."""
        target = urlsplit(self.client.aio.config.sandbox_url)
        tls = ssl.create_default_context() if target.scheme == "https" else None
        host = target.hostname or "127.0.0.1"
        port = target.port or (443 if tls else 80)
        extra = (f"E2b-Sandbox-Id: {sandbox_id}\r\nE2b-Sandbox-Port: {self.port}\r\n").encode()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                upstream_r, upstream_w = await asyncio.open_connection(host, port, ssl=tls,
                                                                       limit=_MAX_HEAD)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                writer.close()
                return
            await _relay(_rewrite(head, extra), reader, writer, upstream_r, upstream_w)

        server = await asyncio.start_server(relay, "127.0.0.1", 0, limit=_MAX_HEAD)
        self._servers[sandbox_id] = server
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def _aclose(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        await self.pool.aclose()

    def _sdk_params(self) -> dict[str, Any]:
        config = self.client.aio.config
        return {"api_url": config.api_url, "api_key": config.api_key,
                "sandbox_url": config.sandbox_url}


def _rewrite(head: bytes, extra: bytes) -> bytes:
    """The request head with the routing headers added; a plain HTTP request also gets
    ``Connection: close`` (later requests on the connection would carry no routing headers)."""
    line, _, rest = head.partition(b"\r\n")
    headers = [h for h in rest.split(b"\r\n") if h]
    upgrade = any(h.lower().startswith(b"upgrade:") for h in headers)
    if not upgrade:
        headers = [h for h in headers if not h.lower().startswith(b"connection:")]
        headers.append(b"Connection: close")
    kept = [h for h in headers if not h.lower().startswith((b"e2b-sandbox-id:",
                                                            b"e2b-sandbox-port:"))]
    return line + b"\r\n" + extra + b"".join(h + b"\r\n" for h in kept) + b"\r\n"


async def _relay(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 upstream_r: asyncio.StreamReader, upstream_w: asyncio.StreamWriter) -> None:
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(_CHUNK):
                dst.write(chunk)
                await dst.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

    try:
        upstream_w.write(head)
        await asyncio.gather(pipe(reader, upstream_w), pipe(upstream_r, writer))
    finally:
        for w in (writer, upstream_w):
            w.close()


class AenvProvider(ContainerProvider):
    """OpenEnv's ``ContainerProvider`` for one client: a fork child per ``start_container``.

    Made by :meth:`AenvOpenEnv.provider`. OpenEnv calls these from whatever thread its client
    runs on (the caller's event loop, even: its interface is synchronous); the work runs on the
    shared client's loop."""

    def __init__(self, envs: AenvOpenEnv) -> None:
        self.envs = envs
        self.sandbox: Sandbox | None = None
        self.base_url: str | None = None

    def start_container(self, image: str, port: int | None = None,
                        env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
        """Prerequisites: ``image`` is a ``dockerfiles`` name, a template, or a registry image
        the node can pull; this provider runs no episode yet.
        On success: the base URL of a fork child of the image's prepared parent (the first
        call for an image builds or finds its template and prepares the parent).
        On failure: the aenv client's errors (``TemplateNotFound``, ``CapacityError``,
        ``SetupFailed`` when the parent's server never answers); nothing of this episode is
        left running. ``port``/``env_vars`` must be None: the child is a copy of a running
        server, its port and environment are the parent's."""
        if self.sandbox is not None:
            raise RuntimeError("this provider already runs an episode; use one per client")
        if port not in (None, self.envs.port) or env_vars:
            raise ValueError("a fork child keeps its parent's port and environment; set them "
                             "in the template")
        self.sandbox, self.base_url = self.envs.client.run_async(self.envs.start(image))
        return self.base_url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """``GET {base_url}/health`` until it answers 200, else ``TimeoutError``."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        with httpx.Client(timeout=5, trust_env=False) as http:
            while time.monotonic() < deadline:
                try:
                    response = http.get(f"{base_url}/health")
                    if response.status_code == 200:
                        return
                    last = response.status_code
                except httpx.HTTPError as exc:
                    last = exc
                time.sleep(0.2)
        raise TimeoutError(f"{base_url}/health did not answer 200 in {timeout_s} s: {last}")

    def stop_container(self) -> None:
        """Kill the episode's child (nothing, when none runs)."""
        sandbox, self.sandbox, self.base_url = self.sandbox, None, None
        if sandbox is not None:
            self.envs.client.run_async(self.envs.stop(sandbox))


__all__ = ["AenvOpenEnv", "AenvProvider", "template_name"]
