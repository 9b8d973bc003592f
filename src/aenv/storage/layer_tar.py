"""A layer directory → one OCI layer tarball, so that a layer can travel as a blob.

Layers on a node are unpacked overlayfs lowers (``storage/layers.py``): whiteouts are 0:0
character devices and opaque directories carry ``trusted.overlay.opaque``. The repository keeps
them as OCI layer tarballs (whiteouts as ``.wh.<name>``, opaque directories as
``.wh..wh..opq``), which ``storage/unpack.py`` turns back into the same tree on any node.

The tarball is **deterministic**: entries sorted by path, numeric owners without names, no
device numbers for whiteouts, so one tree gives one digest on every machine and a layer shared
by many snapshots is stored once. Kept: modes (setuid included), owners, mtimes (to the
second), symlinks, hard links (within the layer), FIFOs, and the ``user.*`` and
``security.capability`` xattrs. Device nodes other than whiteouts and sockets are skipped,
as the unpacker would skip them. Sparse files are written in full (tarfile has no sparse
writer); their holes come back as zeros.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

_OPAQUE = "trusted.overlay.opaque"
_KEPT_XATTRS = ("user.", "security.capability")


def export_tree(root: Path, out: BinaryIO) -> int:
    """Write the tree at ``root`` to ``out`` as an OCI layer tar; returns the entries written.

    Prerequisites: ``root`` is a layer nobody writes to (immutable, or a sandbox's upper while
    the sandbox is paused). On failure: ``OSError``; ``out`` then holds a partial tar.
    """
    written = 0
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in _walk_sorted(root):
            path = root / rel
            st = os.lstat(path)
            mode = st.st_mode
            if stat.S_ISCHR(mode) and st.st_rdev == 0:
                tar.addfile(_whiteout(rel))
                written += 1
                continue
            info = _info(rel, st, path)
            if info is None:
                continue
            info.pax_headers = _xattr_headers(path)
            if stat.S_ISDIR(mode) and _getxattr(path, _OPAQUE) == b"y":
                tar.addfile(info)
                opaque = ".wh..wh..opq" if rel == "." else f"{rel}/.wh..wh..opq"
                tar.addfile(_whiteout(opaque, plain=True))
                written += 2
                continue
            if stat.S_ISREG(mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    info.type = tarfile.LNKTYPE
                    info.linkname = links[key]
                    info.size = 0
                    tar.addfile(info)
                else:
                    links[key] = info.name
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
            else:
                tar.addfile(info)
            written += 1
    return written


def _walk_sorted(root: Path) -> list[str]:
    """Every path under ``root`` relative to it (``.`` first), parents before children."""
    found = ["."]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            found.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    return sorted(found, key=lambda rel: rel.split("/"))


def _info(rel: str, st: os.stat_result, path: Path) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo("./" if rel == "." else rel)
    mode = st.st_mode
    info.mode = stat.S_IMODE(mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = int(st.st_mtime)
    if stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISREG(mode):
        info.type, info.size = tarfile.REGTYPE, st.st_size
    elif stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISFIFO(mode):
        info.type = tarfile.FIFOTYPE
    else:
        return None
    return info


def _whiteout(rel: str, *, plain: bool = False) -> tarfile.TarInfo:
    """``.wh.<name>`` for a whiteout at ``rel`` (``plain``: ``rel`` already is the entry)."""
    if not plain:
        head, _, name = rel.rpartition("/")
        rel = f"{head}/.wh.{name}" if head else f".wh.{name}"
    info = tarfile.TarInfo(rel)
    info.type, info.mode, info.mtime = tarfile.REGTYPE, 0o644, 0
    info.uname = info.gname = ""
    return info


def _xattr_headers(path: Path) -> dict[str, str]:
    headers: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listxattr(path, follow_symlinks=False)):
            if not name.startswith(_KEPT_XATTRS):
                continue
            value = _getxattr(path, name)
            if value is not None:
                # PAX headers are strings; tarfile writes them as UTF-8 and the reader undoes
                # it with surrogateescape, so arbitrary bytes survive the round trip.
                headers["SCHILY.xattr." + name] = value.decode("utf-8", "surrogateescape")
    return headers


def _getxattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None
