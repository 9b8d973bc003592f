"""Layer trees for the repository tests: one with every kind of entry a layer can hold, and a
description of a tree detailed enough that two trees with equal descriptions are the same layer.

:func:`make_layer_tree` sets every owner, mode and mtime explicitly (deepest entries first, so
creating a child does not move its directory's mtime afterwards): two calls give two trees that
differ only in inode numbers, which is what "the same layer on two machines" means. Needs root
(owners, the whiteout device node, ``trusted.*`` xattrs).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

OPAQUE = "trusted.overlay.opaque"
#: Bytes that are not UTF-8: a user xattr must survive the tar's PAX records as they are.
XATTR_VALUE = b"\x00\xff binary \xfe"


def make_layer_tree(root: Path, *, variant: str = "") -> Path:
    """A layer directory at ``root`` holding one of everything; ``variant`` changes one file."""
    root.mkdir(parents=True, exist_ok=True)
    for directory in ("bin", "etc", "home/user", "run", "tmp", "var/cache", "empty"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n" + variant)
    os.setxattr(root / "etc/passwd", "user.note", XATTR_VALUE)
    (root / "bin/busybox").write_bytes(b"\x7fELF" + bytes(range(256)) * 40)
    os.link(root / "bin/busybox", root / "bin/ls")  # a hard link within the layer
    (root / "bin/su").write_bytes(b"setuid helper")
    (root / "bin/sh").symlink_to("busybox")
    (root / "abs-link").symlink_to("/etc/passwd")
    os.mkfifo(root / "run/fifo")
    (root / "home/user/secret").write_text("mine")
    os.chown(root / "home/user/secret", 1000, 1000)
    os.chown(root / "home/user", 1000, 1000)
    (root / "empty-file").write_bytes(b"")
    # What this layer deletes from the ones below: a whiteout, and an opaque directory that
    # hides whatever the lower layers had in var/cache (its own content stays).
    os.mknod(root / "etc/removed", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    os.setxattr(root / "var/cache", OPAQUE, b"y")
    (root / "var/cache/new").write_text("fresh")
    os.setxattr(root / "var/cache", "user.cache", b"kept")
    modes = {
        ".": 0o755, "bin": 0o755, "etc": 0o755, "home": 0o755, "home/user": 0o700, "run": 0o755,
        "tmp": 0o1777, "var": 0o755, "var/cache": 0o755, "empty": 0o700,
        "etc/passwd": 0o644, "bin/busybox": 0o755, "bin/su": 0o4755, "run/fifo": 0o620,
        "home/user/secret": 0o600, "empty-file": 0o2640, "var/cache/new": 0o444,
    }  # fmt: skip
    for rel, mode in modes.items():
        (root / rel).chmod(mode)
    entries = sorted(_relative_paths(root), key=lambda rel: rel.count("/"), reverse=True)
    for number, rel in enumerate([*entries, "."]):
        when = 1_600_000_000 + 1000 * number
        os.utime(root / rel, (when, when), follow_symlinks=False)
    return root


def tree_state(root: Path) -> dict[str, object]:
    """Everything a layer's consumers can observe, by relative path (``.`` the root itself):
    type, mode, owner, mtime (seconds), content digest or link target, kept xattrs; whiteouts
    only as whiteouts (a tar cannot carry their owner, mode or mtime, and overlayfs ignores them);
    and, under ``"<hard links>"``, which paths share an inode."""
    state: dict[str, object] = {}
    inodes: dict[int, list[str]] = {}
    for rel in [".", *_relative_paths(root)]:
        path = root / rel
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode):
            state[rel] = ("whiteout", st.st_rdev)
            continue
        if stat.S_ISREG(st.st_mode):
            body = hashlib.sha256(path.read_bytes()).hexdigest()
            inodes.setdefault(st.st_ino, []).append(rel)
        elif stat.S_ISLNK(st.st_mode):
            body = "-> " + os.readlink(path)
        else:
            body = ""
        xattrs = {}
        if not stat.S_ISLNK(st.st_mode):
            for name in sorted(os.listxattr(path, follow_symlinks=False)):
                if name.startswith("user.") or name == OPAQUE:
                    xattrs[name] = os.getxattr(path, name, follow_symlinks=False)
        state[rel] = (
            stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
            int(st.st_mtime), body, xattrs,
        )  # fmt: skip
    state["<hard links>"] = sorted(sorted(group) for group in inodes.values() if len(group) > 1)
    return state


def _relative_paths(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)
