"""Start a user process with pipes or a pseudo-terminal, as a given OS user.

This is envd's only use of ``subprocess``: these are the *user's* processes (long-lived,
interactive, with PTYs and user switching), not aenv's own helper commands, which go through
``aenv.core.proc``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
import subprocess
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aenv.envd.users import User


@dataclass
class Spawned:
    popen: subprocess.Popen[bytes]
    #: Readable ends in the parent: ``{"stdout": fd, "stderr": fd}`` or ``{"pty": master}``.
    outputs: dict[str, int]
    #: Where input goes: the stdin pipe, the PTY master, or ``None`` (stdin is /dev/null).
    input_fd: int | None
    pty_master: int | None


def _set_controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@dataclass(frozen=True)
class _Identity:
    """Popen's user/group/extra_groups; all ``None`` when we already are that user."""

    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None


def _identity(user: User) -> _Identity:
    if os.geteuid() == user.uid:
        return _Identity()
    return _Identity(user.uid, user.gid, list(user.groups))


def _via_helper(
    helper: str, argv: Sequence[str], user: User, *, ctty: bool
) -> list[str]:
    """``argv`` wrapped in the exec-as helper (see launcher/exec_as.c for why)."""
    groups = ",".join(str(g) for g in user.groups) or "-"
    return [helper, str(user.uid), str(user.gid), groups, "1" if ctty else "0", "--", *argv]


def _check_executable(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Fail like exec would, before the helper is involved, so a typo is an RPC error."""
    program = argv[0]
    found = program if "/" in program else shutil.which(program, path=env.get("PATH", ""))
    if found is None or not os.path.exists(found):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(found):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    user: User,
    pty_size: tuple[int, int] | None,
    stdin: bool,
    exec_helper: str | None = None,
) -> Spawned:
    """Start ``argv``; raises ``OSError`` when it cannot be executed.

    With ``exec_helper`` the user switch (and the PTY's controlling terminal) happen in the
    helper, so Popen can use vfork; without it, Popen switches user itself (fork + exec).
    """
    ident = _identity(user)
    helper = exec_helper if ident.user is not None else None
    if helper is not None:
        _check_executable(argv, env)
        argv = _via_helper(helper, argv, user, ctty=pty_size is not None)
        ident = _Identity()
    if pty_size is not None:
        master, slave = os.openpty()
        try:
            os.set_blocking(master, False)
            set_winsize(slave, *pty_size)
            if ident.user is not None:
                os.fchown(slave, user.uid, -1)
            popen = subprocess.Popen(
                list(argv), stdin=slave, stdout=slave, stderr=slave, env=dict(env), cwd=cwd,
                start_new_session=True, close_fds=True,
                preexec_fn=None if helper is not None else _set_controlling_tty,
                user=ident.user, group=ident.group, extra_groups=ident.extra_groups,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return Spawned(popen, {"pty": master}, master, master)

    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (subprocess.DEVNULL, None)
    child_ends = [out_w, err_w] + ([in_r] if stdin else [])
    try:
        popen = subprocess.Popen(
            list(argv), stdin=in_r, stdout=out_w, stderr=err_w, env=dict(env), cwd=cwd,
            start_new_session=True, close_fds=True,
            user=ident.user, group=ident.group, extra_groups=ident.extra_groups,
        )
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in child_ends:
            os.close(fd)
    for fd in (out_r, err_r) + ((in_w,) if in_w is not None else ()):
        os.set_blocking(fd, False)
    return Spawned(popen, {"stdout": out_r, "stderr": err_r}, in_w, None)


def spawn_with_fds(
    argv: Sequence[str],
    *,
    fds: tuple[int, int, int],
    env: Mapping[str, str],
    cwd: str,
    user: User,
    exec_helper: str | None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` on someone else's stdin/stdout/stderr (the sudo stand-in's), in a new
    session so that envd can kill the whole command."""
    ident = _identity(user)
    if exec_helper is not None and ident.user is not None:
        _check_executable(argv, env)
        argv = _via_helper(exec_helper, argv, user, ctty=False)
        ident = _Identity()
    return subprocess.Popen(
        list(argv), stdin=fds[0], stdout=fds[1], stderr=fds[2], env=dict(env), cwd=cwd,
        start_new_session=True, close_fds=True,
        user=ident.user, group=ident.group, extra_groups=ident.extra_groups,
    )
