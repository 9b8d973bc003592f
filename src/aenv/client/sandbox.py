"""A sandbox the client holds: commands and files over envd (the e2b SDK), the rest via the node.

Everything inside the sandbox goes through the official e2b SDK's ``AsyncSandbox`` (envd's
Connect and HTTP protocols, its keepalives, stdin, its own "is the sandbox gone" probe), so
aenv speaks exactly what E2B clients speak. Lifecycle calls the SDK lacks or does differently
(fork, pause modes, snapshots, kill by label) go through the client's REST layer
(``rest.py``). ``Sandbox.sdk`` is the SDK object itself, for everything not wrapped here.

The SDK's exceptions convert to ``aenv.client.errors`` at one boundary,
:func:`envd_errors`: a sandbox that is gone or unreachable is :class:`SandboxLost`
(infrastructure), a command past its timeout :class:`SandboxTimeout` (the task's doing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx
from e2b import AsyncSandbox, CommandExitException, ConnectionConfig
from e2b import exceptions as e2b_errors
from packaging.version import Version

from aenv.client.config import ClientConfig
from aenv.client.errors import (
    CapacityError,
    ClientError,
    CommandFailed,
    InvalidRequest,
    NotFound,
    SandboxLost,
    SandboxTimeout,
    Unauthenticated,
    Unavailable,
)

if TYPE_CHECKING:
    from aenv.client.client import AsyncClient, SandboxInfo, SnapshotInfo

#: A command's default time limit, the SDK's: 0 means none.
COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int
    #: envd's words when the process could not run or was ended (e.g. by a signal).
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def sdk_sandbox(body: Mapping[str, Any], config: ClientConfig) -> AsyncSandbox:
    """The SDK's ``AsyncSandbox`` for a create / connect / fork answer (``SandboxOut``).

    Built the way the SDK's own ``AsyncSandbox._create`` and ``_cls_fork_sandbox`` build it from
    the same answer (e2b 2.63.0), without a second round trip to the node."""
    sandbox_id = body.get("sandboxID")
    version = body.get("envdVersion")
    if not isinstance(sandbox_id, str) or not isinstance(version, str):
        raise Unavailable(f"unexpected answer from the node (no sandboxID/envdVersion): "
                          f"{dict(body)!r}"[:300])
    token = body.get("envdAccessToken")
    headers = {"E2b-Sandbox-Id": sandbox_id,
               "E2b-Sandbox-Port": str(ConnectionConfig.envd_port)}
    if isinstance(token, str):
        headers["X-Access-Token"] = token
    connection = ConnectionConfig(
        api_key=config.api_key, api_url=config.api_url, sandbox_url=config.sandbox_url,
        domain=config.domain, extra_sandbox_headers=headers,
    )
    traffic = body.get("trafficAccessToken")
    domain = body.get("domain")
    return AsyncSandbox(
        sandbox_id=sandbox_id, sandbox_domain=domain if isinstance(domain, str) else None,
        envd_version=Version(version), envd_access_token=token if isinstance(token, str) else None,
        traffic_access_token=traffic if isinstance(traffic, str) else None,
        connection_config=connection,
    )


@contextlib.contextmanager
def envd_errors(sandbox_id: str, what: str, *, timeout_is_task: bool = False
                ) -> Iterator[None]:
    """Convert the e2b SDK's exceptions raised inside to ``aenv.client.errors``."""
    try:
        yield
    except (ClientError, CommandExitException):
        raise  # ours already; a command's exit is a result (``Sandbox.run``)
    except (e2b_errors.SandboxNotRunningException, e2b_errors.SandboxUnreachableException,
            e2b_errors.SandboxNotFoundException) as exc:
        raise SandboxLost(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc
    except e2b_errors.TimeoutException as exc:
        if timeout_is_task:
            raise SandboxTimeout(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id
                                 ) from exc
        raise Unavailable(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc
    except e2b_errors.FileNotFoundException as exc:
        raise NotFound(f"{what}: {_first_line(exc)}", status=404, sandbox_id=sandbox_id
                       ) from exc
    except e2b_errors.InvalidArgumentException as exc:
        raise InvalidRequest(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc
    except e2b_errors.AuthenticationException as exc:
        raise Unauthenticated(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc
    except e2b_errors.RateLimitException as exc:
        raise CapacityError(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc
    except (e2b_errors.SandboxException, httpx.TransportError, ConnectionError) as exc:
        raise Unavailable(f"{what}: {_first_line(exc)}", sandbox_id=sandbox_id) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:500]


class Sandbox:
    """A running sandbox: ``run``, files, lifecycle. ``async with`` kills it at the end."""

    def __init__(self, client: AsyncClient, sdk: AsyncSandbox, *,
                 template: str | None = None) -> None:
        self._client = client
        self._sdk = sdk
        self.template = template

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r})"

    @property
    def sandbox_id(self) -> str:
        return str(self._sdk.sandbox_id)

    @property
    def sdk(self) -> AsyncSandbox:
        """The e2b SDK's sandbox object (pty, watch, list, ... everything not wrapped here)."""
        return self._sdk

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()

    # -- envd, through the SDK --

    async def run(self, cmd: str, *, timeout: float | None = COMMAND_TIMEOUT_S,
                  envs: Mapping[str, str] | None = None, cwd: str | None = None,
                  user: str | None = None, stdin: str | bytes | None = None,
                  check: bool = False) -> CommandResult:
        """Run ``cmd`` with ``bash -l -c`` and wait for it.

        Prerequisites: the sandbox is running.
        On success: its output and exit code; a non-zero exit is a result, unless ``check``
        (then :class:`CommandFailed`, carrying the result).
        On failure: :class:`SandboxTimeout` past ``timeout`` seconds (None or 0: no limit; the
        process is ended); :class:`SandboxLost` when the sandbox is gone or unreachable.
        ``stdin`` is written to the process and then closed (EOF)."""
        what = f"run in {self.sandbox_id}"
        env = dict(envs) if envs else None
        limit = 0 if timeout is None else timeout
        try:
            with envd_errors(self.sandbox_id, what, timeout_is_task=True):
                if stdin is None:
                    done = await self._sdk.commands.run(cmd, envs=env, cwd=cwd, user=user,
                                                        timeout=limit)
                else:
                    handle = await self._sdk.commands.run(cmd, background=True, stdin=True,
                                                          envs=env, cwd=cwd, user=user,
                                                          timeout=limit)
                    try:
                        if stdin:
                            await handle.send_stdin(stdin)
                        await handle.close_stdin()
                    except BaseException:
                        with contextlib.suppress(Exception):
                            await handle.kill()
                        raise
                    done = await handle.wait()
                result = CommandResult(done.stdout or "", done.stderr or "", done.exit_code,
                                       done.error)
        except CommandExitException as exc:
            result = CommandResult(exc.stdout or "", exc.stderr or "", exc.exit_code, exc.error)
        if check and not result.ok:
            tail = result.stderr.strip()[-500:]
            raise CommandFailed(f"{cmd!r} exited {result.exit_code}" + (f": {tail}" if tail
                                                                         else ""),
                                result, sandbox_id=self.sandbox_id)
        return result

    async def write_file(self, path: str, data: str | bytes, *, user: str | None = None
                         ) -> None:
        """Write ``data`` to ``path`` (parents created, an existing file replaced)."""
        with envd_errors(self.sandbox_id, f"write {path} in {self.sandbox_id}"):
            await self._sdk.files.write(path, data, user=user)

    async def read_file(self, path: str, *, user: str | None = None) -> str:
        """The text of ``path``; :class:`NotFound` if there is no such file."""
        with envd_errors(self.sandbox_id, f"read {path} in {self.sandbox_id}"):
            return await self._sdk.files.read(path, user=user)

    async def read_bytes(self, path: str, *, user: str | None = None) -> bytes:
        with envd_errors(self.sandbox_id, f"read {path} in {self.sandbox_id}"):
            return bytes(await self._sdk.files.read(path, format="bytes", user=user))

    # -- the node, through the client --

    async def kill(self) -> bool:
        """Kill it; False if it was gone already."""
        return await self._client.kill(self.sandbox_id)

    async def pause(self, *, memory: bool = True) -> None:
        await self._client.pause(self.sandbox_id, memory=memory)

    async def resume(self, *, timeout: int | None = None) -> Sandbox:
        """Resume (a no-op when running); the handle stays valid."""
        await self._client.resume(self.sandbox_id, timeout=timeout)
        return self

    async def set_timeout(self, seconds: int) -> None:
        await self._client.set_timeout(self.sandbox_id, seconds)

    async def fork(self, count: int, *, timeout: int | None = None) -> list[Sandbox]:
        return await self._client.fork(self.sandbox_id, count, timeout=timeout)

    async def snapshot(self, name: str | None = None) -> SnapshotInfo:
        return await self._client.snapshot(self.sandbox_id, name=name)

    async def info(self) -> SandboxInfo:
        return await self._client.info(self.sandbox_id)


#: ``Literal`` kept for the docs' sake: the states ``list`` filters on.
State = Literal["running", "paused"]
