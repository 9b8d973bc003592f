"""``aenv cp``: a directory tree into a sandbox and back, every file's sha256 and mode kept."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from e2b import Sandbox

from tests.cli.conftest import Cli


def make_tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "big.bin").write_bytes(os.urandom(6 << 20))  # > the progress threshold
    (root / "sub" / "deep" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "sub" / "deep" / "run.sh").chmod(0o750)
    (root / "sub" / "deep" / "zero").write_bytes(b"")
    (root / "link").symlink_to("a.txt")


def digest(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its sha256 (or link target) and mode."""
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("-> " + os.readlink(path), 0)
        elif path.is_dir():
            found[rel] = ("dir", path.stat().st_mode & 0o7777)
        else:
            found[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                          path.stat().st_mode & 0o7777)
    return found


def remote_digest(sandbox: Sandbox, root: str) -> dict[str, tuple[str, int]]:
    out = sandbox.commands.run(
        f"cd {root} && find . -mindepth 1 | sort | while read -r p; do "
        'if [ -L "$p" ]; then echo "$p|-> $(readlink "$p")|0"; '
        'elif [ -d "$p" ]; then echo "$p|dir|$(stat -c %a "$p")"; '
        'else echo "$p|$(sha256sum < "$p" | cut -d" " -f1)|$(stat -c %a "$p")"; fi; done',
        timeout=60).stdout
    found = {}
    for line in out.splitlines():
        rel, what, mode = line.split("|")
        found[rel.removeprefix("./")] = (what, int(mode, 8))
    return found


def test_tree_both_ways(aenv: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    make_tree(tree)
    want = digest(tree)
    sid = sandbox.sandbox_id

    up = aenv("cp", str(tree), f"{sid}:/home/user/")  # an existing dir: lands as .../tree
    assert up.code == 0, up
    assert remote_digest(sandbox, "/home/user/tree") == want

    renamed = aenv("cp", str(tree), f"{sid}:/home/user/copy")  # not there: copied as it
    assert renamed.code == 0, renamed
    assert remote_digest(sandbox, "/home/user/copy") == want

    back = tmp_path / "back"
    down = aenv("cp", f"{sid}:/home/user/copy", str(back))
    assert down.code == 0, down
    assert digest(back) == want
    into = tmp_path / "into"
    into.mkdir()
    down = aenv("cp", f"{sid}:/home/user/tree", str(into))
    assert down.code == 0, down
    assert digest(into / "tree") == want
    # Nothing of the transfer is left behind, here or there.
    assert sorted(p.name for p in into.iterdir()) == ["tree"]
    left = sandbox.commands.run("ls -a /tmp /home/user", timeout=30).stdout
    assert ".aenv-cp" not in left, left


def test_single_file(aenv: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    local = tmp_path / "notes.sh"
    local.write_text("echo notes\n")
    local.chmod(0o700)
    sid = sandbox.sandbox_id
    assert aenv("cp", str(local), f"{sid}:/tmp/renamed.sh").code == 0
    assert sandbox.files.read("/tmp/renamed.sh") == "echo notes\n"
    assert sandbox.commands.run("stat -c %a /tmp/renamed.sh").stdout.strip() == "700"
    assert aenv("cp", str(local), f"{sid}:/tmp").code == 0  # into a directory
    assert sandbox.files.read("/tmp/notes.sh") == "echo notes\n"
    back = tmp_path / "back.sh"
    assert aenv("cp", f"{sid}:/tmp/renamed.sh", str(back)).code == 0
    assert back.read_text() == "echo notes\n"
    assert back.stat().st_mode & 0o777 == 0o700


def test_errors(aenv: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    missing = aenv("cp", f"{sandbox.sandbox_id}:/no/such", str(tmp_path / "x"))
    assert missing.code == 1 and len(missing.errors()) == 1, missing
    assert "/no/such" in missing.errors()[0]
    assert "Traceback" not in missing.stderr
    local = aenv("cp", str(tmp_path / "nope"), f"{sandbox.sandbox_id}:/tmp/")
    assert local.code == 1 and len(local.errors()) == 1, local
    both = aenv("cp", str(tmp_path), str(tmp_path / "y"))
    assert both.code != 0 and len(both.errors()) == 1, both
