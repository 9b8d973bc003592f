"""The ``busybox`` template: a root with busybox as its only program (static, no libc).

Useful for fast runtime tests and as the smallest image envd must run in. Built into a
:class:`aenv.storage.layers.LayerStore` like every template; the Debian ``base`` lives in
``base.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import struct
import time
from pathlib import Path
from typing import Any

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.storage.layers import LayerStore, layer_id_for
from aenv.templates.base import (
    _HOSTS,
    _RESOLV_CONF,
    HOSTNAME,
    BuildResult,
    ProgressCallback,
    _Reporter,
)

#: Bump when the busybox root changes in a way its recipe does not capture.
BUSYBOX_BUILDER_VERSION = 1


_BUSYBOX_FILES: dict[str, str] = {
    "etc/passwd": (
        "root:x:0:0:root:/root:/bin/sh\n"
        "user:x:1000:1000:user:/home/user:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    ),
    "etc/group": "root:x:0:\nsudo:x:27:user\nuser:x:1000:\nnogroup:x:65534:\n",
    "etc/shadow": "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n",
    "etc/hostname": f"{HOSTNAME}\n",
    "etc/hosts": _HOSTS,
    "etc/resolv.conf": _RESOLV_CONF,
    "etc/profile": 'export PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"\n',
    # Busybox has no bash applet ("bash: applet not found" when called as bash), so /bin/bash
    # is a script handing over to its POSIX shell: enough for ``bash -c`` and ``bash -l``.
    "bin/bash": '#!/bin/sh\nexec /bin/sh "$@"\n',
}
_BUSYBOX_MODES = {"etc/shadow": 0o640, "bin/bash": 0o755}
#: (path, mode, uid, gid) of the directories of the busybox root.
_BUSYBOX_DIRS: tuple[tuple[str, int, int, int], ...] = (
    ("bin", 0o755, 0, 0),
    ("sbin", 0o755, 0, 0),
    ("usr", 0o755, 0, 0),
    ("usr/bin", 0o755, 0, 0),
    ("usr/sbin", 0o755, 0, 0),
    ("etc", 0o755, 0, 0),
    ("dev", 0o755, 0, 0),
    ("proc", 0o555, 0, 0),
    ("sys", 0o555, 0, 0),
    ("run", 0o755, 0, 0),
    ("opt", 0o755, 0, 0),
    ("var", 0o755, 0, 0),
    ("var/tmp", 0o1777, 0, 0),
    ("root", 0o700, 0, 0),
    ("home", 0o755, 0, 0),
    ("home/user", 0o755, 1000, 1000),
    ("tmp", 0o1777, 0, 0),
)


def busybox_recipe(busybox: Path) -> dict[str, Any]:
    """The recipe of the ``busybox`` template made from the binary ``busybox``.

    Prerequisites: ``busybox`` is readable. On success: a JSON-serializable dict.
    On failure: ``OSError`` if the binary cannot be read.
    """
    files = hashlib.sha256(repr(sorted(_BUSYBOX_FILES.items())).encode())
    files.update(repr((_BUSYBOX_DIRS, sorted(_BUSYBOX_MODES.items()))).encode())
    return {
        "template": "busybox",
        "builder_version": BUSYBOX_BUILDER_VERSION,
        "busybox_sha256": hashlib.sha256(Path(busybox).read_bytes()).hexdigest(),
        "files_sha256": files.hexdigest(),
    }


async def build_busybox(
    store: LayerStore,
    *,
    busybox: Path = Path("/bin/busybox"),
    on_progress: ProgressCallback | None = None,
) -> BuildResult:
    """Build the ``busybox`` template layer into ``store``, unless it is already there.

    Prerequisites: ``busybox`` is a statically linked busybox (Debian: busybox-static); root,
    so that /home/user can be owned by uid 1000.
    On success: the layer: /bin/busybox, a link per applet, /bin/bash, /etc/passwd with root
    and user (1000), /home/user, /tmp (1777). ``built=False`` if it already existed.
    On failure: :class:`FailedPrecondition` if ``busybox`` is missing or dynamically linked
    (it could not run inside the rootfs); ``OSError`` for I/O errors (the store is unchanged).
    """
    started = time.monotonic()
    report = _Reporter(on_progress)
    busybox = Path(busybox)
    try:
        data = busybox.read_bytes()
    except FileNotFoundError:
        raise FailedPrecondition(f"{busybox} not found (install busybox-static)") from None
    if not _is_static_elf(data):
        raise FailedPrecondition(f"{busybox} is dynamically linked (install busybox-static)")
    recipe = busybox_recipe(busybox)
    layer_id = layer_id_for(recipe)
    if store.has(layer_id):
        report("busybox template already built", 1.0)
        return BuildResult(store.get(layer_id), False, time.monotonic() - started)
    await store.clean_staging()
    listed = await proc.run([str(busybox), "--list-full"], timeout=30.0)
    applets = [line.strip() for line in listed.text.splitlines() if line.strip()]
    report(f"populating busybox root ({len(applets)} applets)", 0.1)
    async with store.staging(layer_id) as staging:
        await asyncio.to_thread(_populate_busybox, staging, data, applets)
        report("committing the layer", 0.9)
        layer = await store.put_from_dir(staging, layer_id, recipe=recipe)
    report("busybox template ready", 1.0)
    return BuildResult(layer, True, time.monotonic() - started)


def _populate_busybox(root: Path, busybox: bytes, applets: list[str]) -> None:
    for rel, mode, uid, gid in _BUSYBOX_DIRS:
        path = root / rel
        path.mkdir(exist_ok=True)
        os.chown(path, uid, gid)
        path.chmod(mode)
    binary = root / "bin" / "busybox"
    binary.write_bytes(busybox)
    binary.chmod(0o755)
    for rel in applets:
        rel = rel.lstrip("/")
        # Names come from the host's busybox; still, keep every link inside the new root.
        if not rel or ".." in rel.split("/") or rel in ("bin/busybox", "bin/bash"):
            continue
        link = root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() and not link.exists():
            link.symlink_to("/bin/busybox")
    for rel, text in _BUSYBOX_FILES.items():
        path = root / rel
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # /bin/bash may be an applet link from the list above
        path.write_text(text)
        path.chmod(_BUSYBOX_MODES.get(rel, 0o644))


def _is_static_elf(data: bytes) -> bool:
    """Whether an ELF executable has no program interpreter (PT_INTERP), i.e. is static."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return False
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        phoff, phentsize, phnum = (
            struct.unpack_from(endian + "Q", data, 0x20)[0],
            struct.unpack_from(endian + "H", data, 0x36)[0],
            struct.unpack_from(endian + "H", data, 0x38)[0],
        )
    else:
        phoff, phentsize, phnum = (
            struct.unpack_from(endian + "I", data, 0x1C)[0],
            struct.unpack_from(endian + "H", data, 0x2A)[0],
            struct.unpack_from(endian + "H", data, 0x2C)[0],
        )
    pt_interp = 3
    for i in range(phnum):
        offset = phoff + i * phentsize
        if offset + 4 > len(data):
            return False
        if struct.unpack_from(endian + "I", data, offset)[0] == pt_interp:
            return False
    return True


