"""``network/slots.reserve_ports``: the egress proxy's ports join the kernel's reserved list,
whatever it held before (single ports and ranges), and nothing is written when they are in."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.network import slots


def _sysctl(root: Path, value: str) -> Path:
    path = root / "ipv4" / "ip_local_reserved_ports"
    path.parent.mkdir(parents=True)
    path.write_text(value + "\n")
    return path


def test_missing_ports_are_added_and_the_list_kept(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "PROC_SYS", tmp_path)
    path = _sysctl(tmp_path, "1000-1002,5000")
    slots.reserve_ports((1001, 49080, 49443))
    assert path.read_text() == "1000-1002,5000,49080,49443"


def test_ports_already_reserved_write_nothing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "PROC_SYS", tmp_path)
    path = _sysctl(tmp_path, "49000-49500")
    slots.reserve_ports((49080, 49443))
    assert path.read_text() == "49000-49500\n"  # untouched


def test_an_empty_list_gets_the_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "PROC_SYS", tmp_path)
    path = _sysctl(tmp_path, "")
    slots.reserve_ports((49100, 49053))
    assert path.read_text() == "49053,49100"
