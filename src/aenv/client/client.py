"""``AsyncClient``: one node's sandboxes, created under a concurrency bound, labelled by run.

What it adds to the E2B SDK, for a trainer running thousands of rollouts:

* **bounded creates**: at most ``max_concurrent_creates`` creates and forks in flight per
  client (a semaphore), each retried on 429 after the node's ``Retry-After`` with jittered
  backoff, up to one deadline per call (``rest.py``, ``backoff.py``); the deadline starts once
  the call holds the semaphore, so a long client-side queue is not mistaken for a full node;
* **safe retries**: every create sends an ``Idempotency-Key`` (a fresh uuid per logical create,
  the same on each of its retries), so a create whose answer was lost is not a second sandbox;
  the node replays the first answer (``aenv.api.idempotency``);
* **run labels**: every create carries ``run=<run_id>``; closing the client, interpreter exit
  and SIGTERM/SIGINT kill the run's sandboxes (``runs.py``), and ``kill_by_metadata(run=...)``
  cleans up after a process that could not (SIGKILL);
* **typed errors** (``errors.py``): infrastructure apart from the task's failures.

The SDK's own create (and its three 429 retries, which wait ``Retry-After`` without jitter or
a deadline of ours) is not used: ``POST /v2/sandboxes`` goes through httpx here and the SDK's
``AsyncSandbox`` is built from the answer (``sandbox.sdk_sandbox``). Everything envd-side then
runs through that SDK object.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from aenv.client import audit, runs
from aenv.client.audit import AuditRecord
from aenv.client.backoff import Backoff
from aenv.client.config import ClientConfig, resolve
from aenv.client.errors import (
    CapacityError,
    ClientError,
    InvalidRequest,
    SandboxLost,
    TemplateNotFound,
    Unavailable,
    UsageError,
)
from aenv.client.rest import DEFAULT_DEADLINE_S, REQUEST_TIMEOUT_S, NodeApi, RetryPolicy, json_of
from aenv.client.sandbox import Sandbox, State, sdk_sandbox
from aenv.client.teams import Teams
from aenv.client.volumes import Volumes

log = logging.getLogger("aenv.client")

#: Creates in flight per client: a node starts a few at a time (``max_concurrent_starts``)
#: and queues a few dozen; more than this from one client only collects 429s.
MAX_CONCURRENT_CREATES = 8
#: Parallel kills of ``kill_by_metadata``: each takes ~1 s on the node (it reaps processes).
KILL_PARALLELISM = 8
#: The node's largest page of a list (``api/listing.py``).
PAGE = 100


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    template_id: str
    state: str
    metadata: dict[str, str] = field(default_factory=dict)
    started_at: str | None = None
    end_at: str | None = None
    alias: str | None = None
    #: The rest of E2B's ``ListedSandbox`` (None when the node sent none).
    client_id: str | None = None
    cpu_count: int | None = None
    memory_mb: int | None = None
    disk_size_mb: int | None = None
    envd_version: str | None = None

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> SandboxInfo:
        return cls(sandbox_id=str(raw["sandboxID"]), template_id=str(raw.get("templateID", "")),
                   state=str(raw.get("state", "")),
                   metadata={str(k): str(v) for k, v in (raw.get("metadata") or {}).items()},
                   started_at=raw.get("startedAt"), end_at=raw.get("endAt"),
                   alias=raw.get("alias"), client_id=raw.get("clientID"),
                   cpu_count=raw.get("cpuCount"), memory_mb=raw.get("memoryMB"),
                   disk_size_mb=raw.get("diskSizeMB"), envd_version=raw.get("envdVersion"))


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: str
    names: tuple[str, ...] = ()


class Forked(builtins.list[Sandbox]):
    """The children a fork started; ``errors`` holds one error per child that did not."""

    def __init__(self, children: builtins.list[Sandbox],
                 errors: builtins.list[ClientError]) -> None:
        super().__init__(children)
        self.errors = errors


def _quoted(value: str) -> str:
    return quote(value, safe="")


class AsyncClient:
    """A node's sandboxes. Use ``async with AsyncClient() as client:``; see ``docs/client.md``.

    ``api_url``/``api_key``/``sandbox_url``: as ``config.resolve`` finds them when not given.
    ``run_id``: the label of this client's sandboxes (generated when not given).
    ``cleanup``: kill the run's sandboxes on close, at exit and on SIGTERM/SIGINT.
    ``deadline_s``: each call's budget for retries (None: no limit).
    """

    def __init__(self, api_url: str | None = None, api_key: str | None = None, *,
                 sandbox_url: str | None = None, run_id: str | None = None,
                 max_concurrent_creates: int = MAX_CONCURRENT_CREATES,
                 deadline_s: float | None = DEFAULT_DEADLINE_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 backoff: Backoff | None = None, cleanup: bool = True,
                 config: ClientConfig | None = None) -> None:
        if max_concurrent_creates < 1:
            raise UsageError("max_concurrent_creates must be at least 1")
        self.config = config or resolve(api_url, api_key, sandbox_url)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.cleanup = cleanup
        headers = {"X-API-KEY": self.config.api_key} if self.config.api_key else {}
        limits = httpx.Limits(max_connections=max(64, 2 * max_concurrent_creates))
        self._http = httpx.AsyncClient(base_url=self.config.api_url + "/", headers=headers,
                                       timeout=request_timeout_s, limits=limits)
        self._api = NodeApi(self._http, RetryPolicy(backoff or Backoff(), deadline_s,
                                                    request_timeout_s))
        self._creates = asyncio.Semaphore(max_concurrent_creates)
        #: Sandboxes this client created or forked and has not killed.
        self._owned: set[str] = set()
        #: Closing: no new sandboxes (the run is being killed); closed: no calls at all.
        self._closing = False
        self._closed = False
        self._registered = False
        if cleanup:
            # Now, from the thread making the client (handlers need the main thread); the run
            # itself is registered with its first create.
            runs.install_signal_handlers()

    def __repr__(self) -> str:
        return f"AsyncClient({self.config.api_url!r}, run_id={self.run_id!r})"

    @property
    def volumes(self) -> Volumes:
        """The node's volumes and their files (docs/volumes.md)."""
        return Volumes(self._api)

    @property
    def teams(self) -> Teams:
        """The node's teams and the caller's team's API keys (docs/teams.md)."""
        return Teams(self._api)

    async def audit(self, *, limit: int = 100, object_id: str | None = None,
                    actor: str | None = None, before: int | None = None
                    ) -> builtins.list[AuditRecord]:
        """The node's audit log, newest first (docs/audit.md)."""
        return await audit.read(self._api, limit=limit, object_id=object_id, actor=actor,
                                before=before)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Kill the run's sandboxes (with ``cleanup``) and close the connections."""
        if self._closing:
            return
        self._closing = True
        try:
            if self._registered:
                # Shielded: a cancelled trainer (Ctrl-C in asyncio.run) still cleans up.
                await asyncio.shield(self._kill_run())
        finally:
            runs.unregister(id(self))
            self._closed = True
            await self._http.aclose()

    async def _kill_run(self) -> None:
        killed = await self.kill_by_metadata(**{runs.RUN_LABEL: self.run_id})
        await asyncio.gather(*(self.kill(i) for i in builtins.list(self._owned)),
                             return_exceptions=True)
        log.debug("run %s: killed %d sandboxes", self.run_id, len(killed))

    # -- create, connect, fork --

    async def create(self, template: str = "base", *, timeout: int | None = None,
                     metadata: Mapping[str, str] | None = None,
                     envs: Mapping[str, str] | None = None,
                     idempotency_key: str | None = None, auto_pause: bool | None = None,
                     allow_internet_access: bool | None = None) -> Sandbox:
        """Create a sandbox from ``template`` (a template name or id, or a snapshot id).

        Prerequisites: the client is open.
        On success: a running sandbox labelled ``run=<run_id>`` (and ``metadata``).
        On failure: :class:`TemplateNotFound`; :class:`CapacityError` when the node refused
        (429) until the deadline; :class:`Unavailable`. With ``timeout`` (seconds) the node
        ends the sandbox after that long (default: the node's ``default_timeout_s``).
        Retries reuse ``idempotency_key`` (a uuid when not given): at most one sandbox."""
        self._check_open(for_new=True)
        if metadata and metadata.get(runs.RUN_LABEL, self.run_id) != self.run_id:
            raise InvalidRequest(f"metadata {runs.RUN_LABEL!r} is the client's run label "
                                 f"({self.run_id!r}); pass run_id= to the client instead")
        key = idempotency_key or str(uuid.uuid4())
        body: dict[str, Any] = {
            "templateID": template,
            "metadata": {**(metadata or {}), runs.RUN_LABEL: self.run_id},
        }
        if timeout is not None:
            body["timeout"] = timeout
        if envs:
            body["envVars"] = dict(envs)
        if auto_pause is not None:
            body["autoPause"] = auto_pause
        if allow_internet_access is not None:
            body["allow_internet_access"] = allow_internet_access
        what = f"create from {template!r}"
        self._register()
        async with self._creates:
            response = await self._api.request(
                "POST", "v2/sandboxes", what=what, json=body, idempotent=True,
                headers={"Idempotency-Key": key},
                not_found=lambda text: TemplateNotFound(text, status=404))
        return await self._adopt(json_of(response, what), template)

    async def connect(self, sandbox_id: str, *, timeout: int | None = None) -> Sandbox:
        """A handle on an existing sandbox, resumed if it was paused.

        On failure: :class:`SandboxLost` if there is no such sandbox."""
        self._check_open()
        body = {} if timeout is None else {"timeout": timeout}
        what = f"connect to {sandbox_id}"
        response = await self._api.request(
            "POST", f"v2/sandboxes/{_quoted(sandbox_id)}/connect", what=what, json=body,
            idempotent=True, sandbox_id=sandbox_id)
        return Sandbox(self, sdk_sandbox(json_of(response, what), self.config))

    async def resume(self, sandbox_id: str, *, timeout: int | None = None) -> Sandbox:
        """Resume a paused sandbox (a running one is left as it is); a handle on it."""
        return await self.connect(sandbox_id, timeout=timeout)

    async def fork(self, sandbox_id: str, count: int, *, timeout: int | None = None) -> Forked:
        """``count`` children of a running sandbox, each with its files and processes.

        Prerequisites: the sandbox is running; ``1 <= count <= the node's max_fork_count``.
        On success: the children that started (labelled like the parent); ``.errors`` names
        each child that did not. Children the node refused for capacity (429) are asked for
        again, with backoff, until the deadline: those come from a later checkpoint of the
        parent, the same state if the parent did nothing meanwhile.
        On failure (raised only when no child started): the children's error (e.g.
        :class:`CapacityError`); :class:`SandboxLost` if the parent is gone; ``Conflict`` if
        it is paused or busy."""
        self._check_open(for_new=True)
        if count < 1:
            raise InvalidRequest("fork count must be at least 1")
        what = f"fork {sandbox_id}"
        children: builtins.list[Sandbox] = []
        errors: builtins.list[ClientError] = []
        self._register()
        async with self._creates:
            deadline = self._api.deadline()
            wanted, attempt = count, 0
            while wanted:
                body: dict[str, Any] = {"count": wanted}
                if timeout is not None:
                    body["timeout"] = timeout
                try:
                    response = await self._api.request(
                        "POST", f"sandboxes/{_quoted(sandbox_id)}/fork", what=what, json=body,
                        idempotent=False, deadline=deadline, sandbox_id=sandbox_id)
                except ClientError as exc:
                    if not children:
                        raise
                    errors.extend([exc] * wanted)  # keep the children already started
                    break
                entries = json_of(response, what)
                if not isinstance(entries, builtins.list):
                    raise InvalidRequest(f"{what}: unexpected answer {entries!r}"[:300])
                refused: builtins.list[CapacityError] = []
                for entry in entries:
                    if isinstance(entry, dict) and isinstance(entry.get("sandbox"), dict):
                        children.append(await self._adopt(entry["sandbox"], None))
                    else:
                        error = _fork_error(entry, what)
                        if isinstance(error, CapacityError):
                            refused.append(error)
                        else:
                            errors.append(error)
                wanted = len(refused)
                if not wanted:
                    break
                delay = self._api.policy.backoff.delay(attempt)
                if not deadline.allows(delay):
                    errors.extend(refused)
                    break
                await asyncio.sleep(delay)
                attempt += 1
        if not children and errors:
            raise errors[0]
        return Forked(children, errors)

    async def _adopt(self, body: Any, template: str | None) -> Sandbox:
        if not isinstance(body, dict):
            raise InvalidRequest(f"unexpected sandbox in the node's answer: {body!r}"[:300])
        sandbox = Sandbox(self, sdk_sandbox(body, self.config), template=template)
        self._owned.add(sandbox.sandbox_id)
        if self._closing:  # created while the client closed: do not let it escape the cleanup
            await self.kill(sandbox.sandbox_id)
            raise UsageError("the client was closed while the sandbox was created")
        return sandbox

    # -- the rest of the lifecycle --

    async def info(self, sandbox_id: str) -> SandboxInfo:
        what = f"get {sandbox_id}"
        response = await self._api.request("GET", f"sandboxes/{_quoted(sandbox_id)}",
                                           what=what, idempotent=True, sandbox_id=sandbox_id)
        return SandboxInfo.from_wire(json_of(response, what))

    async def list(self, *, metadata: Mapping[str, str] | None = None,
                   state: State | builtins.list[State] | None = None) -> builtins.list[SandboxInfo]:
        """Sandboxes on the node (running and paused, or ``state``) whose metadata has every
        pair of ``metadata``; all pages."""
        self._check_open()
        params: dict[str, Any] = {"limit": PAGE}
        if metadata:
            params["metadata"] = urlencode(dict(metadata))
        if state:
            params["state"] = ",".join([state] if isinstance(state, str) else state)
        found: builtins.list[SandboxInfo] = []
        while True:
            response = await self._api.request("GET", "v2/sandboxes", what="list sandboxes",
                                               params=params, idempotent=True)
            page = json_of(response, "list sandboxes")
            found.extend(SandboxInfo.from_wire(s) for s in page)
            token = response.headers.get("x-next-token")
            if not token:
                return found
            params["nextToken"] = token

    async def kill(self, sandbox_id: str) -> bool:
        """Kill a sandbox (running or paused); False if it did not exist (any more)."""
        try:
            await self._api.request("DELETE", f"sandboxes/{_quoted(sandbox_id)}",
                                    what=f"kill {sandbox_id}", idempotent=True,
                                    retry_statuses=(409,),  # busy in another operation
                                    sandbox_id=sandbox_id)
        except SandboxLost:
            self._owned.discard(sandbox_id)
            return False
        self._owned.discard(sandbox_id)
        return True

    async def kill_by_metadata(self, **labels: str) -> builtins.list[str]:
        """Kill every sandbox whose metadata has all ``labels``; the ids killed.
        ``kill_by_metadata(run=<run id>)`` is the cleanup of a run that died."""
        if not labels:
            raise InvalidRequest("kill_by_metadata needs at least one label (it would kill "
                                 "every sandbox)")
        found = await self.list(metadata=labels)
        gate = asyncio.Semaphore(KILL_PARALLELISM)

        async def one(sandbox_id: str) -> bool:
            async with gate:
                return await self.kill(sandbox_id)

        done = await asyncio.gather(*(one(s.sandbox_id) for s in found))
        return [s.sandbox_id for s, killed in zip(found, done, strict=True) if killed]

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Pause: ``memory=False`` keeps only the files (a node with disk workspaces; resume
        then boots afresh). :class:`Conflict` if it is paused already."""
        body = {} if memory else {"memory": False}
        await self._api.request("POST", f"sandboxes/{_quoted(sandbox_id)}/pause",
                                what=f"pause {sandbox_id}", json=body, idempotent=False,
                                sandbox_id=sandbox_id)

    async def set_timeout(self, sandbox_id: str, seconds: int) -> None:
        """End the sandbox ``seconds`` from now (longer or shorter than before)."""
        await self._api.request("POST", f"sandboxes/{_quoted(sandbox_id)}/timeout",
                                what=f"set the timeout of {sandbox_id}",
                                json={"timeout": seconds}, idempotent=True,
                                sandbox_id=sandbox_id)

    # -- snapshots --

    async def snapshot(self, sandbox_id: str, *, name: str | None = None) -> SnapshotInfo:
        """A snapshot of a running sandbox (it runs on); create from its id to restore it."""
        what = f"snapshot {sandbox_id}"
        response = await self._api.request(
            "POST", f"sandboxes/{_quoted(sandbox_id)}/snapshots", what=what,
            json={} if name is None else {"name": name}, idempotent=False,
            sandbox_id=sandbox_id)
        return _snapshot_info(json_of(response, what))

    async def list_snapshots(self, *, sandbox_id: str | None = None
                             ) -> builtins.list[SnapshotInfo]:
        params: dict[str, Any] = {"limit": PAGE}
        if sandbox_id:
            params["sandboxID"] = sandbox_id
        found: builtins.list[SnapshotInfo] = []
        while True:
            response = await self._api.request("GET", "snapshots", what="list snapshots",
                                               params=params, idempotent=True)
            found.extend(_snapshot_info(s) for s in json_of(response, "list snapshots"))
            token = response.headers.get("x-next-token")
            if not token:
                return found
            params["nextToken"] = token

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot; False if there was none of that id."""
        try:
            await self._api.request("DELETE", f"templates/{_quoted(snapshot_id)}",
                                    what=f"delete snapshot {snapshot_id}", idempotent=True)
        except ClientError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _register(self) -> None:
        if self.cleanup and not self._registered:
            runs.register(id(self), self.config, self.run_id, self._owned)
            self._registered = True

    def _check_open(self, *, for_new: bool = False) -> None:
        if self._closed or (for_new and self._closing):
            raise UsageError("the client is closed")


def _snapshot_info(raw: Any) -> SnapshotInfo:
    if not isinstance(raw, dict) or not isinstance(raw.get("snapshotID"), str):
        raise InvalidRequest(f"unexpected snapshot in the node's answer: {raw!r}"[:300])
    return SnapshotInfo(raw["snapshotID"], tuple(str(n) for n in raw.get("names") or ()))


def _fork_error(entry: Any, what: str) -> ClientError:
    error = entry.get("error") if isinstance(entry, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = str(error.get("message")) if isinstance(error, dict) else repr(entry)
    text = f"{what}: a child failed: {code} {message}"
    if code == 429:
        return CapacityError(text)
    if isinstance(code, int) and 400 <= code < 500:
        return InvalidRequest(text, status=code)
    return Unavailable(text, status=code if isinstance(code, int) else None)
