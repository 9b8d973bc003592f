"""The other end of the sudo stand-in (``launcher/sudo.c``): run a command as another user for
a caller that sudo would allow.

Runtimes such as gVisor set no_new_privs on every task, so setuid sudo cannot gain root. The
stand-in connects to ``/run/aenv/sudo.sock`` and passes its request and its stdin/stdout/stderr.
Who the caller is comes from ``SCM_CREDENTIALS`` on the request (``SO_PASSCRED``): the kernel
checks what a sender claims there (only its own pid, and one of its own uids unless it has
CAP_SETUID) and fills it in when the sender sends none. ``SO_PEERCRED`` is not used: gVisor
(runsc 20240729) answers it with the *asking* task's credentials, so envd saw every caller as
root. ``sudoers.py`` decides who may. If the stand-in goes away (Ctrl-C), the command's session
is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import re
import signal
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aenv.core.errors import AenvError, PermissionDenied
from aenv.envd import pidlimit
from aenv.envd.process.manager import DEFAULT_PATH
from aenv.envd.process.spawn import spawn_with_fds
from aenv.envd.sudoers import caller_name, may_sudo
from aenv.envd.users import lookup_user

log = logging.getLogger("aenv.envd.sudo")

SOCKET_PATH = "/run/aenv/sudo.sock"
MAGIC = "aenv-sudo-1"
MAX_REQUEST = 4 * 1024 * 1024
#: Room for the three passed descriptors and one ``struct ucred``, each its own message.
_UCRED = struct.Struct("iII")
_ANCILLARY = socket.CMSG_SPACE(3 * 4) + socket.CMSG_SPACE(_UCRED.size)
_FIRST_READ = 64 * 1024
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Request:
    user: str
    cwd: str
    flags: str
    argv: list[str]
    env: dict[str, str]


def parse(payload: bytes) -> Request:
    parts = payload.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    fields = [p.decode("utf-8", "surrogateescape") for p in parts]
    if len(fields) < 6 or fields[0] != MAGIC:
        raise ValueError("not a sudo request")
    user, cwd, flags = fields[1], fields[2], fields[3]
    argc = int(fields[4])
    argv = fields[5 : 5 + argc]
    envc = int(fields[5 + argc])
    env_list = fields[6 + argc : 6 + argc + envc]
    if len(argv) != argc or len(env_list) != envc:
        raise ValueError("truncated sudo request")
    env = dict(e.split("=", 1) for e in env_list if "=" in e)
    return Request(user, cwd, flags, argv, env)


def command_for(request: Request, caller_uid: int) -> tuple[list[str], dict[str, str], str]:
    """argv, environment and cwd of the command, as sudo would build them."""
    target = lookup_user(request.user)
    shell = pwd.getpwnam(target.name).pw_shell or "/bin/sh"
    argv = list(request.argv)
    extra: dict[str, str] = {}
    while argv and _ASSIGNMENT.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        extra[name] = value
    cwd = request.cwd
    if "i" in request.flags:
        argv = [shell, "-l"] + (["-c", " ".join(argv)] if argv else [])
        cwd = target.home
    elif "s" in request.flags:
        argv = [request.env.get("SHELL", shell)] + (["-c", " ".join(argv)] if argv else [])
    if not argv:
        raise ValueError("no command")
    if "E" in request.flags:
        env = dict(request.env)
    else:
        env = {"PATH": DEFAULT_PATH}
        for keep in ("TERM", "LANG", "LC_ALL", "COLORTERM", "DISPLAY"):
            if keep in request.env:
                env[keep] = request.env[keep]
    caller = pwd.getpwuid(caller_uid)
    env.update(
        HOME=target.home, USER=target.name, LOGNAME=target.name, SHELL=shell,
        SUDO_USER=caller.pw_name, SUDO_UID=str(caller_uid), SUDO_GID=str(caller.pw_gid),
        SUDO_COMMAND=" ".join(request.argv),
    )
    env.update(extra)
    if not os.path.isdir(cwd):
        cwd = target.home if os.path.isdir(target.home) else "/"
    return argv, env, cwd


class SudoServer:
    def __init__(self, exec_helper: str | None, path: str = SOCKET_PATH) -> None:
        self.exec_helper = exec_helper
        self.path = path
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen (best effort: envd works without it, sudo then reports it cannot connect)."""
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
            Path(self.path).unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # Set before listen() so that accepted connections inherit it (Linux and gVisor)
            # and a request's first bytes already carry the sender's credentials.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(self.path)
            Path(self.path).chmod(0o666)  # anyone may ask; the sender's credentials decide
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            log.warning("sudo socket unavailable: %s", exc)
            return
        self._sock = sock
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop(sock))

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        running: set[asyncio.Task[None]] = set()
        while True:
            conn, _ = await loop.sock_accept(sock)
            task = loop.create_task(self._serve(conn))
            running.add(task)
            task.add_done_callback(running.discard)

    def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(OSError):
                Path(self.path).unlink()

    async def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            payload, fds, uid = await asyncio.to_thread(_receive, conn)
            try:
                if uid is None:
                    raise PermissionDenied("the request came without the sender's credentials")
                if len(fds) != 3:
                    raise ValueError("expected stdin, stdout and stderr")
                if not await asyncio.to_thread(may_sudo, uid):
                    raise PermissionDenied(f"{caller_name(uid)} is not in the sudoers file")
                request = parse(payload)
                argv, env, cwd = command_for(request, uid)
                with pidlimit.spawning():
                    popen = spawn_with_fds(
                        argv, fds=(fds[0], fds[1], fds[2]), env=env, cwd=cwd,
                        user=lookup_user(request.user), exec_helper=self.exec_helper,
                    )
            except (ValueError, OSError, AenvError) as exc:
                message = exc.message if isinstance(exc, AenvError) else str(exc)
                await _send(conn, struct.pack(">I", 0xFFFFFFFF) + message.encode())
                return
            finally:
                for fd in fds:
                    os.close(fd)
                fds = []
            code = await _wait_or_abandon(conn, popen)
            await _send(conn, struct.pack(">I", code))
        except Exception:
            log.exception("sudo request failed")
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()


def _receive(conn: socket.socket) -> tuple[bytes, list[int], int | None]:
    """The request, the descriptors passed with it and the sender's uid: ``None`` unless
    every part of the request came with credentials, all of one uid."""
    conn.setblocking(True)
    conn.settimeout(10)
    data = b""
    fds: list[int] = []
    uids: set[int | None] = set()
    try:
        size: int | None = None
        while size is None or len(data) < 4 + size:
            want = _FIRST_READ if size is None else 4 + size - len(data)
            chunk, ancillary, _flags, _addr = conn.recvmsg(want, _ANCILLARY)
            if not chunk:
                raise ValueError("short request")
            data += chunk
            uids.add(_unpack_ancillary(ancillary, fds))
            if size is None and len(data) >= 4:
                (size,) = struct.unpack(">I", data[:4])
                if size > MAX_REQUEST:
                    raise ValueError("request too large")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    conn.setblocking(False)
    uid = uids.pop() if len(uids) == 1 else None
    return data[4 : 4 + size], fds, uid


def _unpack_ancillary(ancillary: list[tuple[int, int, bytes]], fds: list[int]) -> int | None:
    """Adds passed descriptors to ``fds``; returns the sender's uid if credentials came."""
    uid = None
    for level, kind, body in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_RIGHTS:
            usable = len(body) - len(body) % 4
            fds += list(struct.unpack(f"{usable // 4}i", body[:usable]))
        elif kind == socket.SCM_CREDENTIALS and len(body) >= _UCRED.size:
            pid, sender_uid, _gid = _UCRED.unpack(body[: _UCRED.size])
            # Linux reports pid 0 (and the overflow uid) for bytes sent before SO_PASSCRED
            # applied and without explicit credentials: not an identity.
            uid = sender_uid if pid > 0 else None
    return uid


async def _send(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().sock_sendall(conn, data)


class _Child(Protocol):
    pid: int

    def wait(self) -> int: ...


async def _wait_or_abandon(conn: socket.socket, popen: _Child) -> int:
    """The command's exit status (shell style); kills it if the stand-in disconnects first."""
    loop = asyncio.get_running_loop()
    waiter = asyncio.ensure_future(asyncio.to_thread(popen.wait))
    gone = asyncio.ensure_future(loop.sock_recv(conn, 1))
    done, _ = await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
    gone.cancel()
    code = await waiter
    return code if code >= 0 else 128 - code
