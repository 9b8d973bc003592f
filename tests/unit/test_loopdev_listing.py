"""Which loop devices ``loopdev.list_loops`` reads: those /proc/partitions names (attached
ones have a size), not every device the host ever made; all of them when it is unreadable."""

from __future__ import annotations

from pathlib import Path

from aenv.storage import loopdev

PARTITIONS = """major minor  #blocks  name

 254        0   41943040 vda
   7        2   10485760 loop2
   7       11   10485760 loop11
"""


def _device(sys_block: Path, name: str, backing: str | None) -> None:
    (sys_block / name).mkdir()
    if backing is not None:
        (sys_block / name / "loop").mkdir()
        (sys_block / name / "loop" / "backing_file").write_text(backing + "\n")
        (sys_block / name / "loop" / "autoclear").write_text("1\n")
        (sys_block / name / "loop" / "dio").write_text("0\n")


def test_only_the_devices_with_a_size_are_read(tmp_path: Path) -> None:
    sys_block = tmp_path / "block"
    sys_block.mkdir()
    _device(sys_block, "loop2", "/srv/a.img")
    _device(sys_block, "loop11", "/srv/b.img (deleted)")
    _device(sys_block, "loop0", None)
    # Listed nowhere with a size: a stale sysfs entry must not be taken for an attached one.
    _device(sys_block, "loop7", "/srv/stale.img")
    partitions = tmp_path / "partitions"
    partitions.write_text(PARTITIONS)

    found = loopdev.list_loops(str(sys_block), str(partitions))

    assert [(d.device, d.backing_file, d.deleted, d.autoclear) for d in found] == [
        ("/dev/loop11", "/srv/b.img", True, True),
        ("/dev/loop2", "/srv/a.img", False, True),
    ]


def test_every_device_is_read_without_proc_partitions(tmp_path: Path) -> None:
    sys_block = tmp_path / "block"
    sys_block.mkdir()
    _device(sys_block, "loop2", "/srv/a.img")
    _device(sys_block, "loop0", None)
    _device(sys_block, "loop7", "/srv/c.img")

    found = loopdev.list_loops(str(sys_block), str(tmp_path / "missing"))

    assert [d.device for d in found] == ["/dev/loop2", "/dev/loop7"]

