"""A sandbox's disk exports take turns (``storage/disk_exports.py``): one that runs after a
snapshot's answer and one that a pause asks for never overlap, and a kill's clean-up of the
previous export waits for the exports still in flight."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aenv.storage.blobs import BlobCache
from aenv.storage.disk_exports import DiskExportOrder, DiskExports
from aenv.storage.manifest import DiskImage
from tests.storage.disk_files import chunk_digests, clone_file

pytestmark = [pytest.mark.anyio]


@pytest.fixture
def exports(tmp_path: Path) -> DiskExports:
    cache = BlobCache(tmp_path / "cache")
    cache.start()
    return DiskExports(cache)


def _order(tmp_path: Path, clone: Path) -> DiskExportOrder:
    return DiskExportOrder(clone=str(clone), index_file=str(tmp_path / "s1.json"),
                           pin=str(tmp_path / "s1.last.img"), sandbox_id="s1",
                            snapshot_id="snap-1")


async def test_exports_of_one_sandbox_take_turns(exports: DiskExports, tmp_path: Path) -> None:
    first_clone, first_data = clone_file(tmp_path, "c1.img")
    second_clone, second_data = clone_file(tmp_path, "c2.img")
    first, second = _order(tmp_path, first_clone), _order(tmp_path, second_clone)
    exports.hold(first)
    exports.hold(second)
    gate = asyncio.Event()
    seen: list[str] = []

    async def before_pin(image: DiskImage) -> None:
        seen.append("first exported")
        await gate.wait()

    running = asyncio.ensure_future(exports.export(first, before_pin))
    following = asyncio.ensure_future(exports.export(second))
    # Until the first waits before its pin (its read took over 0.3 s on a loaded CI host),
    # then a moment for the second to run if it (wrongly) did not wait its turn.
    deadline = asyncio.get_running_loop().time() + 60
    while not seen:
        assert asyncio.get_running_loop().time() < deadline, "the first export never ended"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    # The first waits before its pin; the second has not read a byte meanwhile.
    assert seen == ["first exported"] and not following.done()
    assert second_clone.exists() and first_clone.exists()
    gate.set()
    one, two = await running, await following
    exports.release(first)
    exports.release(second)
    assert [c.digest for c in one.chunks] == chunk_digests(first_data)
    assert [c.digest for c in two.chunks] == chunk_digests(second_data)
    # The second came last: its clone is the pin, and no clone is left beside it.
    assert Path(second.pin).read_bytes() == second_data
    assert not first_clone.exists() and not second_clone.exists()


async def test_a_kill_during_an_export_drops_the_pin_when_it_ends(
        exports: DiskExports, tmp_path: Path) -> None:
    earlier, _ = clone_file(tmp_path, "c0.img", chunks=1)
    await exports.export_now(_order(tmp_path, earlier))
    pin, index = Path(str(tmp_path / "s1.last.img")), tmp_path / "s1.json"
    assert pin.exists() and index.exists()

    clone, _ = clone_file(tmp_path, "c1.img")
    order = _order(tmp_path, clone)
    exports.hold(order)  # a snapshot was answered; its commit exports later
    exports.forget(index, pin)  # the sandbox is killed meanwhile
    assert pin.exists() and index.exists(), "the export in flight still needs them"
    await exports.export(order)
    assert pin.exists()
    exports.release(order)  # its commit ended
    assert not pin.exists() and not index.exists()
    assert sorted(os.listdir(tmp_path)) == ["cache"]


async def test_a_kill_with_no_export_in_flight_drops_the_pin_at_once(
        exports: DiskExports, tmp_path: Path) -> None:
    clone, _ = clone_file(tmp_path, "c1.img", chunks=1)
    order = _order(tmp_path, clone)
    await exports.export_now(order)
    exports.forget(Path(order.index_file), Path(order.pin))
    assert sorted(os.listdir(tmp_path)) == ["cache"]
