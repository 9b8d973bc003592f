"""The busybox template, the base recipe's identity, and mmdebstrap progress parsing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.storage.layers import LayerStore, layer_id_for
from aenv.storage.rootfs import RootfsStore
from aenv.templates.base import BaseRecipe, _Reporter, base_recipe
from aenv.templates.busybox import build_busybox
from aenv.templates.mmdebstrap import MmdebstrapProgress
from tests.storage.conftest import needs_busybox, needs_root

pytestmark = pytest.mark.anyio


@needs_root
@needs_busybox
async def test_busybox_template(layers: LayerStore, roots: RootfsStore) -> None:
    seen: list[tuple[str, float | None]] = []
    result = await build_busybox(layers, on_progress=lambda m, f: seen.append((m, f)))
    assert result.built and result.seconds < 30
    fractions = [f for _, f in seen if f is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0

    root = result.layer.path
    assert (root / "bin/busybox").stat().st_mode & 0o777 == 0o755
    assert (root / "bin/sh").readlink() == Path("/bin/busybox")
    assert "user:x:1000:1000:user:/home/user:/bin/bash" in (root / "etc/passwd").read_text()
    home = (root / "home/user").stat()
    assert (home.st_uid, home.st_gid) == (1000, 1000)
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert result.layer.meta.recipe is not None
    assert result.layer.meta.recipe["template"] == "busybox"

    again = await build_busybox(layers)
    assert not again.built and again.layer.path == root

    rootfs = await roots.assemble("bb", [root])
    done = await proc.run(
        ["chroot", "--userspec=1000:1000", str(rootfs), "/bin/bash", "-l", "-c", "id -un; pwd"],
        timeout=30,
        cwd="/",
    )
    assert done.text.split()[0] == "user"
    await roots.disassemble("bb", keep_upper=False)


async def test_busybox_must_be_static(layers: LayerStore, tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="dynamically linked"):
        await build_busybox(layers, busybox=Path("/bin/ls"))
    with pytest.raises(FailedPrecondition, match="not found"):
        await build_busybox(layers, busybox=tmp_path / "nope")
    assert layers.list() == []


@pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="needs mmdebstrap")
async def test_base_recipe_identity() -> None:
    one = await base_recipe()
    assert layer_id_for(one) == layer_id_for(await base_recipe())
    assert one["mmdebstrap"].startswith("mmdebstrap ")
    assert {"python3", "git", "curl", "sudo"} <= set(one["packages"])
    more = await base_recipe(BaseRecipe(packages=(*BaseRecipe().packages, "vim-tiny")))
    other_script = await base_recipe(BaseRecipe(customize_script="true\n"))
    ids = {layer_id_for(one), layer_id_for(more), layer_id_for(other_script)}
    assert len(ids) == 3


# Shaped like a real ``mmdebstrap --verbose`` log (abridged).
_LOG = """\
I: automatically chosen mode: root
I: running apt-get update...
Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
Fetched 9422 kB in 1s (6301 kB/s)
I: downloading packages with apt...
0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.
Get:1 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9 [2758 kB]
Get:2 http://deb.debian.org/debian bookworm/main amd64 bash amd64 5.2.15-2 [1491 kB]
I: extracting archives...
I: installing essential packages...
Unpacking libc6:amd64 (2.36-9) ...
Setting up libc6:amd64 (2.36-9) ...
Setting up bash (5.2.15-2) ...
I: installing remaining packages inside the chroot...
0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.
Get:1 http://deb.debian.org/debian bookworm/main amd64 git amd64 1:2.39.5 [7264 kB]
Setting up git (1:2.39.5) ...
I: running --customize-hook in shell: sh -c 'chroot "$1" /bin/sh /tmp/aenv-customize.sh'
W: something odd
I: cleaning package lists and apt cache...
I: success in 70.5 seconds
"""


def test_mmdebstrap_log_becomes_monotonic_progress() -> None:
    seen: list[tuple[str, float | None]] = []
    now = [0.0]
    parser = MmdebstrapProgress(_Reporter(lambda m, f: seen.append((m, f))), lambda: now[0])
    for line in _LOG.splitlines():
        parser.feed(line)
        if line.startswith("I: extracting"):
            # Extraction prints nothing for ~20 s: the timer keeps the bar moving, short of
            # the phase's end.
            for second in range(1, 120):
                now[0] = second
                parser.tick()
    messages = [m for m, _ in seen]
    assert "downloading libc6 (1/2)" in messages
    assert "unpacking libc6 (1/2)" in messages
    assert "setting up bash (2/2)" in messages  # essential count carried over from downloads
    assert "setting up git (1/1)" in messages
    assert "something odd" in messages
    fractions = [f for _, f in seen if f is not None]
    assert fractions == sorted(fractions)
    assert 0.9 < fractions[-1] < 1.0  # the commit after mmdebstrap reaches 1.0
    extracting = [f for m, f in seen if m.startswith("extracting") and f is not None]
    assert len(extracting) > 10 and 0.35 < extracting[-1] < 0.40
    assert dict(seen)["setting up bash (2/2)"] == pytest.approx(0.40 + 0.17 * (0.6 / 2 + 0.4))
