"""A busybox-only root filesystem for tests: no Python, no libc, no dynamic loader."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
USER_UID = 1000


def make_busybox_root(root: Path, extra_dirs: tuple[str, ...] = ()) -> Path:
    for d in ("bin", "etc", "root", "tmp", "proc", "dev", "sys", "home/user", *extra_dirs):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        if not (root / "bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    # The SDK runs `/bin/bash -l -c CMD`. Debian's busybox has no bash applet (a symlink named
    # bash says "applet not found"), so bash is a script handing its arguments to busybox sh.
    (root / "bin" / "bash").write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    (root / "bin" / "bash").chmod(0o755)
    (root / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\nuser:x:{USER_UID}:{USER_UID}:user:/home/user:/bin/sh\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\nuser:x:{USER_UID}:\n")
    os.chown(root / "home" / "user", USER_UID, USER_UID)
    (root / "root").chmod(0o700)
    (root / "tmp").chmod(0o1777)
    return root
