"""``aenv cp SRC ID:DEST`` and ``aenv cp ID:SRC DEST``: files and trees, docker's form.

One tar archive carries a file or a whole tree each way, through envd's file API (the e2b
SDK's streamed ``files.write`` / ``files.read(format="stream")``) and ``tar`` in the sandbox.
Why not envd per file: a tree of thousands of small files would be thousands of round trips,
and the file API keeps no modes. Why not tar on a command's stdout: envd's command output is
text (decoded UTF-8), which a binary stream does not survive.

Upload: the tree is packed here into a temporary file (its size known: a progress bar), sent
to ``/tmp/.aenv-cp-<uuid>.tar`` in the sandbox, unpacked by ``tar -x`` there and removed.
Download: ``tar -c`` in the sandbox into such a file, streamed here with a progress bar,
unpacked with Python's ``tarfile`` under its ``tar`` filter (the guest is untrusted: no
absolute paths, no ``..``, no links out of the destination, no device files), removed there.
Modes are kept both ways; owners are the receiving user's (``tar --no-same-owner``).

Where things land, as ``docker cp``: a DEST that is an existing directory receives SRC under
its own name; otherwise SRC is copied *as* DEST (a file renamed, a directory's contents into a
new directory DEST). Here the result appears complete or not at all: it is unpacked into a
fresh directory next to DEST and renamed into place.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Annotated

import anyio
import anyio.to_thread
import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from aenv.cli.common import client, err, examples, fail, run
from aenv.client import Sandbox
from aenv.client.sandbox import envd_errors

_CHUNK = 1 << 20
#: Below this a transfer shows no bar: it is over before a bar would draw.
PROGRESS_MIN_BYTES = 4 << 20
#: tar in the sandbox; a large tree takes a while to pack or unpack.
TAR_TIMEOUT_S = 3600.0


def register(app: typer.Typer) -> None:
    app.command("cp", epilog=examples(
        "aenv cp ./repo i4c2…:/home/user/          (the tree as /home/user/repo)",
        "aenv cp ./notes.txt i4c2…:/tmp/renamed.txt",
        "aenv cp i4c2…:/home/user/repo ./out        (./out/repo if ./out exists, else ./out)",
        "aenv cp --user root ./etc.conf i4c2…:/etc/app.conf",
    ))(cp)


def _split(spec: str) -> tuple[str | None, str]:
    """``ID:PATH`` as (id, path); a local path (no colon before any slash) as (None, path)."""
    head, colon, tail = spec.partition(":")
    if colon and head and "/" not in head and not head.startswith("."):
        return head, tail
    return None, spec


def cp(
    src: Annotated[str, typer.Argument(help="LOCAL_PATH or ID:PATH", show_default=False)],
    dest: Annotated[str, typer.Argument(help="ID:PATH or LOCAL_PATH", show_default=False)],
    user: Annotated[str | None, typer.Option(
        "--user", "-u", help="the sandbox user who reads or owns the files")] = None,
) -> None:
    """Copy a file or a directory tree into a sandbox or out of it (modes kept)."""
    (src_id, src_path), (dest_id, dest_path) = _split(src), _split(dest)
    if (src_id is None) == (dest_id is None):
        fail("copy between this machine and a sandbox: one of SRC and DEST must be ID:PATH")
    if not src_path or not dest_path:
        fail("SRC and DEST need a path (ID:PATH)")
    if dest_id is not None:
        local = Path(src_path)
        if not local.exists() and not local.is_symlink():
            fail(f"{src_path}: no such file or directory")

        async def upload_flow() -> None:
            async with client() as c:
                sbx = await c.connect(dest_id)
                await upload(sbx, local, dest_path, user)

        run(upload_flow)
    else:
        assert src_id is not None

        async def download_flow() -> None:
            async with client() as c:
                sbx = await c.connect(src_id)
                await download(sbx, src_path, Path(dest_path), user)

        run(download_flow)


async def upload(sbx: Sandbox, local: Path, dest: str, user: str | None) -> None:
    """``local`` (file or tree) to ``dest`` in ``sbx``: see the module doc for where."""
    name = local.resolve().name if local.name in ("", ".", "..") else local.name
    remote_tar = f"/tmp/.aenv-cp-{uuid.uuid4().hex}.tar"
    with tempfile.TemporaryFile() as archive:
        await anyio.to_thread.run_sync(_pack, local, name, archive)
        total = archive.tell()
        archive.seek(0)
        with _progress(f"{local} → {sbx.sandbox_id}:{dest}", total) as (progress, task):
            async def chunks() -> AsyncIterator[bytes]:
                while chunk := await anyio.to_thread.run_sync(archive.read, _CHUNK):
                    progress.advance(task, len(chunk))
                    yield chunk

            with envd_errors(sbx.sandbox_id, f"upload to {sbx.sandbox_id}"):
                await sbx.sdk.files.write(remote_tar, chunks(), user=user)
    await _in_sandbox(sbx, _UNPACK.format(tar=shlex.quote(remote_tar), dest=shlex.quote(dest),
                                          name=shlex.quote(name)), user)


async def download(sbx: Sandbox, src: str, dest: Path, user: str | None) -> None:
    """``src`` (file or tree) of ``sbx`` to ``dest`` here: see the module doc for where."""
    path = PurePosixPath(src)
    name = path.name
    if name in ("", ".", ".."):
        fail(f"{src}: name a file or directory by its path (not /, . or ..)")
    remote_tar = f"/tmp/.aenv-cp-{uuid.uuid4().hex}.tar"
    try:
        size = await _in_sandbox(sbx, _PACK.format(
            tar=shlex.quote(remote_tar), parent=shlex.quote(str(path.parent)),
            name=shlex.quote(name), src=shlex.quote(src)), user)
        total = int(size.strip() or 0)
        with tempfile.TemporaryFile() as archive, _progress(
                f"{sbx.sandbox_id}:{src} → {dest}", total) as (progress, task):
            with envd_errors(sbx.sandbox_id, f"download from {sbx.sandbox_id}"):
                stream = await sbx.sdk.files.read(remote_tar, format="stream", user=user)
                async with stream:
                    async for chunk in stream:
                        await anyio.to_thread.run_sync(archive.write, chunk)
                        progress.advance(task, len(chunk))
            archive.seek(0)
            await anyio.to_thread.run_sync(_unpack, archive, name, dest)
    finally:
        with anyio.CancelScope(shield=True), envd_errors(sbx.sandbox_id, "clean up"):
            await sbx.sdk.commands.run(f"rm -f {shlex.quote(remote_tar)}", user=user,
                                       timeout=30)


# Unpack into a fresh directory beside the target, then rename into place (docker's rules).
_UNPACK = """set -e
tar={tar}; dest={dest}; name={name}
trap 'rm -f "$tar"' EXIT
if [ -d "$dest" ]; then
  parent="$dest"; target="$dest/$name"
else
  case "$dest" in */) mkdir -p "$dest"; parent="$dest"; target="$dest/$name";;
  *) parent=$(dirname -- "$dest"); target="$dest"; mkdir -p -- "$parent";; esac
fi
stage=$(mktemp -d "$parent/.aenv-cp.XXXXXX")
trap 'rm -f "$tar"; rm -rf "$stage"' EXIT
tar -xpf "$tar" --no-same-owner -C "$stage"
if [ -d "$target" ] && [ -d "$stage/$name" ]; then
  cp -a "$stage/$name/." "$target/"
else
  rm -f -- "$target" 2>/dev/null || true
  mv -T -- "$stage/$name" "$target"
fi
"""

_PACK = """set -e
if [ ! -e {src} ] && [ ! -L {src} ]; then echo "{src}: no such file or directory" >&2; exit 2; fi
tar -cf {tar} -C {parent} -- {name}
stat -c %s {tar}
"""


async def _in_sandbox(sbx: Sandbox, script: str, user: str | None) -> str:
    result = await sbx.run(script, user=user, timeout=TAR_TIMEOUT_S)
    if not result.ok:
        problem = (result.stderr.strip() or result.error or f"exit {result.exit_code}")
        fail(f"in {sbx.sandbox_id}: {' '.join(problem.split())[:400]}")
    return result.stdout


def _pack(local: Path, name: str, archive: IO[bytes]) -> None:
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(local, arcname=name)


def _unpack(archive: IO[bytes], name: str, dest: Path) -> None:
    """The archive (one member tree named ``name``) to ``dest``, by docker's rules."""
    if dest.is_dir():
        parent, target = dest, dest / name
    else:
        parent, target = dest.parent, dest
        parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".aenv-cp.", dir=parent))
    try:
        try:
            with tarfile.open(fileobj=archive, mode="r") as tar:
                tar.extractall(stage, filter=_member)
        except tarfile.TarError as exc:  # a filter's refusal names the member
            fail(f"refused what the sandbox sent: {exc}")
        staged = stage / name
        if target.is_dir() and staged.is_dir() and not staged.is_symlink():
            shutil.copytree(staged, target, symlinks=True, dirs_exist_ok=True)
        else:
            if target.is_dir() and not target.is_symlink():
                fail(f"{target}: is a directory (copying a file onto it)")
            staged.replace(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[tuple[Progress, TaskID]]:
    """A transfer bar on stderr for ``total`` bytes (none when small or not a terminal)."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True,
                   disable=total < PROGRESS_MIN_BYTES or not err.is_terminal)
    with bar:
        yield bar, bar.add_task(label, total=total)


def _member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``tar`` filter, except that a symlink pointing out of the tree (a venv's
    ``python -> /usr/bin/python3``) is kept: nothing is written through it, since the filter
    checks every member's own path with the links already on disk resolved. Owners are
    ours, whoever owned the files in the sandbox."""
    mine = member.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)
    try:
        return tarfile.tar_filter(mine, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        if not mine.issym():
            raise
        checked = tarfile.tar_filter(mine.replace(linkname=".", deep=False), dest)
        return checked.replace(linkname=mine.linkname, deep=False)
