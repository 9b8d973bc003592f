"""R's debs for the code-interpreter template (orchestrator/ops/interpreter_debs.py): resolved
against the base's own apt files and package database, once per base, and never with the
host's apt state. apt itself runs in tests/server/test_code_interpreter.py (a real build)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.core.errors import FailedPrecondition
from aenv.orchestrator.ops import interpreter_debs, interpreter_inputs
from aenv.orchestrator.ops.interpreter_debs import BaseSystem


def _base(root: Path, status: str = "Package: bash\n") -> BaseSystem:
    etc = root / "etc" / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    dpkg = root / "var" / "lib" / "dpkg"
    dpkg.mkdir(parents=True)
    (dpkg / "status").write_text(status)
    return BaseSystem(etc_apt=etc, status=dpkg / "status")


def test_the_key_names_the_base_s_packages_and_sources(tmp_path: Path) -> None:
    one = _base(tmp_path / "one")
    assert one.key() == _base(tmp_path / "same").key()
    assert _base(tmp_path / "more", "Package: bash\n\nPackage: vim\n").key() != one.key()
    other = _base(tmp_path / "sources")
    (other.etc_apt / "sources.list.d" / "extra.list").write_text("deb http://x/ y main\n")
    assert other.key() != one.key()


def test_the_topmost_layer_holding_a_path_wins(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "etc" / "apt").mkdir(parents=True)
    (upper / "etc" / "apt").mkdir(parents=True)
    assert interpreter_debs._topmost([lower, upper], "etc/apt") == upper / "etc" / "apt"
    with pytest.raises(FailedPrecondition, match="no /var/lib/dpkg/status"):
        interpreter_debs._topmost([lower, upper], "var/lib/dpkg/status")


def test_apt_uses_the_base_s_files_and_its_own_state(tmp_path: Path) -> None:
    base = _base(tmp_path / "base")
    apt = tmp_path / "cache" / "apt"
    conf = interpreter_debs._apt_dir(apt, base).read_text()
    assert (apt / "status").read_text() == base.status.read_text()
    assert f'Dir::Etc::SourceList "{base.etc_apt}/sources.list";' in conf
    assert f'Dir::Etc::TrustedParts "{base.etc_apt}/trusted.gpg.d";' in conf
    assert f'Dir::State::status "{apt}/status";' in conf
    assert f'Dir::State::Lists "{apt}/lists";' in conf
    assert "#clear APT::Update::Post-Invoke;" in conf
    # Nothing points at the host's apt state.
    assert "/var/lib/apt" not in conf and "/etc/apt" not in conf.replace(str(base.etc_apt), "")


def test_a_resolution_keeps_only_its_debs(tmp_path: Path) -> None:
    staging = tmp_path / "r-debs.partial"
    (staging / "partial").mkdir(parents=True)
    (staging / "lock").write_text("")
    (staging / "r-base-core_4.2.2_amd64.deb").write_bytes(b"deb")
    (tmp_path / "r-debs-0123456789abcdef").mkdir()  # an older base's
    done = tmp_path / "r-debs-fedcba9876543210"
    interpreter_debs._commit(staging, done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-debs-fedcba9876543210"]
    assert [p.name for p in done.iterdir()] == ["r-base-core_4.2.2_amd64.deb"]


def test_debs_already_there_are_used_as_they_are(tmp_path: Path) -> None:
    key = "ab" * 32
    done = tmp_path / f"r-debs-{key[:16]}"
    done.mkdir()
    for name in ("r-base-core_4.2.2_amd64.deb", "r-cran-irkernel_1.3.2-1_all.deb",
                 "libz_1%3a1_amd64.deb"):
        (done / name).write_bytes(b"deb")
    base = BaseSystem(etc_apt=tmp_path / "nowhere", status=tmp_path / "nowhere")
    found = asyncio.run(interpreter_debs.debs(tmp_path, base, key))
    assert [p.name for p in found] == ["libz_1%3a1_amd64.deb", "r-base-core_4.2.2_amd64.deb",
                                       "r-cran-irkernel_1.3.2-1_all.deb"]
    (done / "r-cran-irkernel_1.3.2-1_all.deb").unlink()
    with pytest.raises(FailedPrecondition, match="r-cran-irkernel"):
        asyncio.run(interpreter_debs.debs(tmp_path, base, key))


def test_one_fetch_failing_stops_the_other() -> None:
    stopped = asyncio.Event()

    async def slow() -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return 1

    async def failing() -> int:
        await asyncio.sleep(0.01)
        raise OSError("mirror away")

    async def main() -> None:
        with pytest.raises(OSError, match="mirror away"):
            await interpreter_inputs._all(slow(), failing())
        assert stopped.is_set()
        assert await interpreter_inputs._all(asyncio.sleep(0, "a"), asyncio.sleep(0, 2)) == ("a", 2)

    asyncio.run(asyncio.wait_for(main(), 10))
