"""The start command's output copied to envd's console (``envd/process/console_tee.py``) and
read back by the node's log collector (``orchestrator/sandbox_logs.py``): whole lines with
their stream, a line split across reads joined, a long line cut, the copy bounded, and the
collector's entries under ``source: start``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.envd.process.console_tee import MAX_LINE, ConsoleTee
from aenv.orchestrator.sandbox_logs import LogBook, console_entry
from aenv.store.sandbox_logs import SandboxLogStore
from aenv.store.sqlite import Store


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    path = tmp_path / "console.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        yield fd, path
    finally:
        os.close(fd)


def test_whole_lines_each_with_its_stream(console: tuple[int, Path]) -> None:
    fd, path = console
    tee = ConsoleTee(fd)
    tee.write("stdout", b"serving on :8000\nhal")
    tee.write("stderr", b"WARNING: no config\n")
    tee.write("stdout", b"f a line\r\n" + b"x" * (MAX_LINE + 100))
    tee.close()
    lines = path.read_bytes().decode().splitlines()
    assert lines[:3] == ["[start stdout] serving on :8000", "[start stderr] WARNING: no config",
                         "[start stdout] half a line"]
    assert lines[3].startswith("[start stdout] xxx") and lines[3].endswith("...")
    assert len(lines) == 4


def test_the_copy_is_bounded(console: tuple[int, Path]) -> None:
    fd, path = console
    tee = ConsoleTee(fd, limit=1000)
    for i in range(200):
        tee.write("stdout", f"line {i}\n".encode())
    lines = path.read_bytes().decode().splitlines()
    assert len(path.read_bytes()) <= 1000 + 200
    assert "not copied" in lines[-1] and len(lines) < 60


def test_a_failed_write_is_dropped() -> None:
    tee = ConsoleTee(fd=987654)  # not open
    tee.write("stdout", b"nobody reads this\n")
    tee.close()


@pytest.mark.anyio
async def test_the_collector_files_them_under_source_start(tmp_path: Path,
                                                            console: tuple[int, Path]) -> None:
    fd, path = console
    os.write(fd, b"envd: listening\n")
    tee = ConsoleTee(fd)
    tee.write("stderr", b"ERROR: port taken\n")
    tee.write("stdout", b"[start x] not a stream\n")
    store = await Store.open(tmp_path / "state.db")
    book = LogBook(store, SandboxLogStore(store.db), lambda _: path)
    await book.collect("s1", None)
    await book.flush()
    rows = await book.rows.page("s1", since=None, limit=10)
    assert [(r.level, r.message, r.fields) for r in rows] == [
        ("info", "envd: listening", {"source": "console"}),
        ("error", "ERROR: port taken", {"source": "start", "stream": "stderr"}),
        ("info", "[start x] not a stream", {"source": "start", "stream": "stdout"})]
    assert console_entry("[start stdin] x")[2] == {"source": "console"}
    await store.close()
