"""bin/exec-as, the helper every command of another user starts through: it switches user and
execs as execvp(3) would, without libc (launcher/exec_as.c)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.envd.harness import dev_exec_helper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switches user: needs root")


def _run(*argv: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(dev_exec_helper()), *argv], capture_output=True, text=True,
                          env={"PATH": path}, timeout=30)


def test_it_becomes_the_user_with_its_groups() -> None:
    done = _run("4321", "4322", "27,100", "0", "--", "id", "-u")
    assert (done.returncode, done.stdout) == (0, "4321\n")
    done = _run("4321", "4322", "27,100", "0", "--", "id", "-G")
    assert done.stdout.split() == ["4322", "27", "100"]
    done = _run("4321", "4322", "-", "0", "--", "/usr/bin/id", "-G")
    assert done.stdout.split() == ["4322"]


def test_a_missing_program_is_127_and_one_it_cannot_run_126() -> None:
    missing = _run("0", "0", "-", "0", "--", "no-such-program")
    assert missing.returncode == 127
    assert missing.stderr == "exec-as: exec no-such-program: No such file or directory\n"
    directory = _run("0", "0", "-", "0", "--", "/etc")
    assert (directory.returncode, directory.stderr) == (
        126, "exec-as: exec /etc: Permission denied\n")


def test_path_is_searched_in_order_and_a_script_without_shebang_runs_under_sh(
        tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for where, text in ((first, "echo first $0 $1\n"), (second, "echo second\n")):
        where.mkdir()
        (where / "tool").write_text(text)
        (where / "tool").chmod(0o755)
    done = _run("0", "0", "-", "0", "--", "tool", "arg", path=f"{first}:{second}:/bin")
    assert (done.returncode, done.stdout) == (0, f"first {first}/tool arg\n")
    # Not executable in the first entry: execvp goes on, and reports EACCES only if none ran.
    (first / "tool").chmod(0o644)
    assert _run("0", "0", "-", "0", "--", "tool", path=f"{first}:{second}").stdout == "second\n"
    denied = _run("0", "0", "-", "0", "--", "tool", path=f"{first}")
    assert denied.returncode == 126 and "Permission denied" in denied.stderr


def test_bad_arguments_are_refused() -> None:
    assert _run("0", "0").returncode == 2
    assert _run("0", "0", "-", "0", "x", "true").returncode == 2
    bad = _run("12a", "0", "-", "0", "--", "true")
    assert (bad.returncode, bad.stderr) == (126, "exec-as: bad id: Invalid argument\n")
    assert _run("0", "0", "1,,2", "0", "--", "true").returncode == 126
    assert _run("4294967296", "0", "-", "0", "--", "true").returncode == 126


def test_it_links_no_libc() -> None:
    """The reason it exists as it does: no interpreter, no libc start-up on every command."""
    helper = dev_exec_helper()
    header = helper.read_bytes()
    assert b"GLIBC" not in header and b"/lib64/ld-linux" not in header
    assert helper.stat().st_size < 32 * 1024
