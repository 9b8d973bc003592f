"""``aenv volume``: a volume made, filled, listed, read back byte for byte and removed by name,
through the CLI against a real node; each failure is one ``error:`` line naming the cause."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, Result


def _name() -> str:
    return f"cli-vol-{secrets.token_hex(4)}"


def one_error(result: Result) -> str:
    assert result.code == 1, result
    assert len(result.errors()) == 1, result
    assert "Traceback" not in result.stderr, result
    return result.errors()[0]


@pytest.fixture
def volume(aenv: Cli) -> Iterator[tuple[str, str]]:
    """A fresh volume's (name, id); removed after the test if it still exists."""
    name = _name()
    made = aenv("volume", "create", name, "--size-mb", "64")
    assert made.code == 0, made
    volume_id = made.stdout.strip()
    assert str(uuid.UUID(volume_id)) == volume_id, made
    try:
        yield name, volume_id
    finally:
        aenv("volume", "rm", volume_id)


def files(aenv: Cli, volume: str, path: str = "/", depth: int = 5) -> dict[str, dict[str, object]]:
    listed = aenv("volume", "files", volume, path, "--depth", str(depth), "--json")
    assert listed.code == 0, listed
    return {e["path"]: e for e in json.loads(listed.stdout)}


def test_files_round_trip(aenv: Cli, volume: tuple[str, str], tmp_path: Path) -> None:
    name, volume_id = volume
    listed = json.loads(aenv("volume", "ls", "--json").stdout)
    assert {"volumeID": volume_id, "name": name, "sizeMB": 64} in listed
    table = aenv("volume", "ls")
    assert table.code == 0 and table.stdout.split()[:3] == ["VOLUME", "ID", "NAME"], table
    assert any(line.split()[:2] == [volume_id, name] for line in table.stdout.splitlines())

    data = secrets.token_bytes(5 << 20 | 12345)  # several pieces, the last one partial
    local = tmp_path / "blob.bin"
    local.write_bytes(data)
    # --force makes the missing parent /data; by name here, by id below.
    put = aenv("volume", "put", name, str(local), "/data/blob.bin", "--force")
    assert put.code == 0, put
    again = aenv("volume", "put", volume_id, str(local), "/data/blob.bin")
    assert "already exists" in one_error(again) and "--force" in again.stderr
    assert aenv("volume", "put", name, str(local), "/data/blob.bin", "-f").code == 0

    found = files(aenv, name)
    assert sorted(found) == ["/data", "/data/blob.bin"]
    assert (found["/data"]["type"], found["/data/blob.bin"]["type"]) == ("directory", "file")
    assert found["/data/blob.bin"]["size"] == len(data)
    assert "/data/blob.bin" in aenv("volume", "files", name, "/data").stdout

    got = tmp_path / "got.bin"
    done = aenv("volume", "get", name, "/data/blob.bin", str(got))
    assert done.code == 0 and done.stdout == "", done
    assert got.read_bytes() == data
    into = tmp_path / "into"
    into.mkdir()
    assert aenv("volume", "get", volume_id, "/data/blob.bin", str(into)).code == 0
    assert (into / "blob.bin").read_bytes() == data

    text = tmp_path / "notes.txt"
    text.write_text("line one\nline two\n")
    assert aenv("volume", "put", name, str(text), "/notes.txt").code == 0
    for args in (("/notes.txt",), ("/notes.txt", "-")):  # stdout: by default and with -
        shown = aenv("volume", "get", name, *args)
        assert (shown.code, shown.stdout) == (0, "line one\nline two\n"), shown

    assert aenv("volume", "mkdir", name, "-p", "/made/deep/er").code == 0
    assert files(aenv, name, "/made")["/made/deep/er"]["type"] == "directory"
    assert "already exists" in one_error(aenv("volume", "mkdir", name, "/made/deep"))
    assert aenv("volume", "mkdir", name, "--parents", "/made/deep").code == 0  # like mkdir -p
    assert aenv("volume", "rmf", name, "/made", "/notes.txt").code == 0
    assert sorted(files(aenv, name)) == ["/data", "/data/blob.bin"]


def test_rm_by_name(aenv: Cli) -> None:
    name = _name()
    made = aenv("volume", "create", name)
    assert made.code == 0, made
    volume_id = made.stdout.strip()
    removed = aenv("volume", "rm", name)
    assert (removed.code, removed.stdout) == (0, f"{volume_id}\n"), removed
    assert volume_id not in aenv("volume", "ls").stdout
    assert name in one_error(aenv("volume", "rm", name))


def test_errors_are_one_line(aenv: Cli, volume: tuple[str, str], tmp_path: Path) -> None:
    name, _ = volume
    assert "already exists" in one_error(aenv("volume", "create", name))
    assert "Invalid volume name" in one_error(aenv("volume", "create", "no/slashes"))

    local = tmp_path / "kept.txt"
    local.write_text("kept")
    missing = one_error(aenv("volume", "get", name, "/nope.txt", str(local)))
    assert "/nope.txt" in missing and "not found" in missing
    assert local.read_text() == "kept"  # a failed get leaves the local file alone
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
    assert "not found" in one_error(aenv("volume", "get", name, "/nope.txt"))
    assert "not found" in one_error(aenv("volume", "rmf", name, "/nope.txt"))
    assert "not found" in one_error(aenv("volume", "files", name, "/nope"))

    unknown = _name()
    assert unknown in one_error(aenv("volume", "files", unknown))
    assert "not a file" in one_error(aenv("volume", "put", name, str(tmp_path), "/x"))
