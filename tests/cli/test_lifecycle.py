"""``aenv ls|pause|resume|timeout|kill|fork|snapshot|logs|metrics`` against a real node."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from e2b import Sandbox

from tests.cli.conftest import Cli

#: E2B's ListedSandbox, in the node's order (the E2B SDK's model has the same names).
LISTED = ["sandboxID", "templateID", "alias", "clientID", "startedAt", "endAt", "cpuCount",
          "memoryMB", "diskSizeMB", "state", "envdVersion", "metadata"]


def test_ls_table_and_json(aenv: Cli, node: object) -> None:
    a = Sandbox.create(timeout=300, metadata={"cli": "ls", "which": "a"})
    b = Sandbox.create(timeout=300, metadata={"cli": "ls", "which": "b"})
    try:
        table = aenv("ls", "-m", "cli=ls")
        assert table.code == 0, table
        header, *rows = table.stdout.strip().splitlines()
        assert header.split()[:4] == ["SANDBOX", "ID", "TEMPLATE", "STATE"]
        assert sorted(r.split()[0] for r in rows) == sorted([a.sandbox_id, b.sandbox_id])

        listed = json.loads(aenv("ls", "--json", "-m", "cli=ls", "-m", "which=b").stdout)
        assert [s["sandboxID"] for s in listed] == [b.sandbox_id]
        assert list(listed[0]) == LISTED
        assert listed[0]["state"] == "running"
        assert listed[0]["metadata"] == {"cli": "ls", "which": "b"}

        a.beta_pause()
        paused = json.loads(aenv("ls", "--json", "--state", "paused", "-m", "cli=ls").stdout)
        assert [s["sandboxID"] for s in paused] == [a.sandbox_id]
        running = json.loads(aenv("ls", "--json", "--state", "running", "-m", "cli=ls").stdout)
        assert [s["sandboxID"] for s in running] == [b.sandbox_id]
        bad = aenv("ls", "--state", "sleeping")
        assert bad.code != 0 and len(bad.errors()) == 1, bad
    finally:
        a.kill()
        b.kill()


def state(aenv: Cli, sandbox_id: str) -> str:
    found = json.loads(aenv("ls", "--json").stdout)
    return next((s["state"] for s in found if s["sandboxID"] == sandbox_id), "gone")


def test_pause_resume_timeout_kill(aenv: Cli, sandbox: Sandbox) -> None:
    sid = sandbox.sandbox_id
    sandbox.files.write("/home/user/kept.txt", "kept\n")
    assert aenv("pause", sid).code == 0
    assert state(aenv, sid) == "paused"
    again = aenv("pause", sid)
    assert again.code == 1 and len(again.errors()) == 1, again  # 409: one line
    assert aenv("resume", sid).code == 0
    assert state(aenv, sid) == "running"
    assert aenv("exec", sid, "--", "cat /home/user/kept.txt").stdout == "kept\n"

    assert aenv("timeout", sid, "1234").code == 0
    end = datetime.fromisoformat(sandbox.get_info().end_at.isoformat())
    left = (end - datetime.now(UTC)).total_seconds()
    assert 1200 < left <= 1234, left

    killed = aenv("kill", sid)
    assert (killed.code, killed.stdout) == (0, f"{sid}\n"), killed
    assert state(aenv, sid) == "gone"


def test_kill_by_metadata(aenv: Cli) -> None:
    """What cleans up after a SIGKILLed trainer: ``aenv kill --metadata run=…``."""
    run = [Sandbox.create(timeout=300, metadata={"run": "dead-trainer"}) for _ in range(3)]
    other = Sandbox.create(timeout=300, metadata={"run": "alive"})
    try:
        done = aenv("kill", "--metadata", "run=dead-trainer")
        assert done.code == 0, done
        assert sorted(done.stdout.split()) == sorted(s.sandbox_id for s in run)
        assert json.loads(aenv("ls", "--json", "-m", "run=dead-trainer").stdout) == []
        assert state(aenv, other.sandbox_id) == "running"
        none = aenv("kill", "--metadata", "run=dead-trainer")
        assert (none.code, none.stdout) == (0, ""), none
        assert aenv("kill").code != 0  # neither ids nor labels: refused, kills nothing
        assert state(aenv, other.sandbox_id) == "running"
    finally:
        other.kill()


def test_fork(aenv: Cli, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/parent.txt", "from the parent\n")
    done = aenv("fork", sandbox.sandbox_id, "-n", "3")
    assert done.code == 0, done
    children = done.stdout.split()
    assert len(children) == 3 and len(set(children)) == 3, done
    try:
        for child in children:
            answer = aenv("exec", child, "--", "cat /home/user/parent.txt")
            assert (answer.code, answer.stdout) == (0, "from the parent\n"), answer
        as_json = aenv("fork", sandbox.sandbox_id, "-n", "1", "--json")
        assert as_json.code == 0, as_json
        extra = [c["sandboxID"] for c in json.loads(as_json.stdout)]
        assert len(extra) == 1
        children += extra
    finally:
        aenv("kill", *children)


def test_snapshots(aenv: Cli, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/snap.txt", "in the snapshot\n")
    made = aenv("snapshot", "create", sandbox.sandbox_id, "--name", "cli-snap")
    assert made.code == 0, made
    snapshot_id = made.stdout.strip()
    listed = aenv("snapshot", "ls", "--sandbox", sandbox.sandbox_id, "--json")
    assert snapshot_id in [s["snapshotID"] for s in json.loads(listed.stdout)], listed
    assert snapshot_id in aenv("snapshot", "ls").stdout
    restored = Sandbox.create(snapshot_id, timeout=120)
    try:
        assert restored.files.read("/home/user/snap.txt") == "in the snapshot\n"
    finally:
        restored.kill()
    removed = aenv("snapshot", "rm", snapshot_id)
    assert (removed.code, removed.stdout) == (0, f"{snapshot_id}\n"), removed
    assert snapshot_id not in aenv("snapshot", "ls").stdout
    gone = aenv("snapshot", "rm", snapshot_id)
    assert gone.code == 1 and len(gone.errors()) == 1, gone


def test_logs_and_metrics(aenv: Cli, sandbox: Sandbox) -> None:
    logs = aenv("logs", sandbox.sandbox_id)
    assert logs.code == 0, logs
    assert "INFO  sandbox created" in logs.stdout, logs
    entries = [json.loads(line) for line in
               aenv("logs", sandbox.sandbox_id, "--json").stdout.splitlines()]
    assert entries[0]["message"] == "sandbox created" and entries[0]["level"] == "info"
    assert entries[0]["fields"] == {"event": "state:running", "from": "creating"}
    assert aenv("logs", sandbox.sandbox_id, "--level", "error").stdout == ""
    metrics = json.loads(aenv("metrics", sandbox.sandbox_id, "--json").stdout)
    assert metrics and metrics[0]["mem_total"] > 0 and metrics[0]["cpu_count"] >= 1
    table = aenv("metrics", sandbox.sandbox_id)
    assert table.code == 0 and "MEMORY" in table.stdout, table



def test_logs_follow_until_the_kill(aenv: Cli) -> None:
    sandbox = Sandbox.create(timeout=120)
    with ThreadPoolExecutor(1) as pool:
        followed = pool.submit(aenv, "logs", "-f", sandbox.sandbox_id)
        time.sleep(2)  # following by now
        assert not followed.done()
        sandbox.kill()
        done = followed.result(timeout=30)
    assert done.code == 0, done
    lines = done.stdout.splitlines()
    assert "sandbox created" in lines[0] and "sandbox killed" in lines[-1], lines
    assert len(lines) == len(set(lines))  # nothing printed twice
