"""``aenv exec``: exit codes passed through, stdin from a pipe, output streamed as it comes."""

from __future__ import annotations

import hashlib
import subprocess
import time

from e2b import Sandbox

from tests.cli.conftest import AENV, Cli


def test_exit_codes(aenv: Cli, sandbox: Sandbox) -> None:
    ok = aenv("exec", sandbox.sandbox_id, "--", "echo", "hello world")
    assert (ok.code, ok.stdout) == (0, "hello world\n"), ok
    three = aenv("exec", sandbox.sandbox_id, "--", "echo out; echo err >&2; exit 3")
    assert (three.code, three.stdout, three.stderr) == (3, "out\n", "err\n"), three
    killed = aenv("exec", sandbox.sandbox_id, "--", "kill -9 $$")
    assert killed.code == 128 + 9, killed  # as a shell reports a SIGKILLed command
    termed = aenv("exec", sandbox.sandbox_id, "--", "kill -TERM $$")
    assert termed.code == 128 + 15, termed


def test_options(aenv: Cli, sandbox: Sandbox) -> None:
    done = aenv("exec", "--cwd", "/tmp", "--env", "GREETING=hi there", "--user", "root",
                sandbox.sandbox_id, "--", 'echo "$PWD $GREETING $(id -un)"')
    assert (done.code, done.stdout) == (0, "/tmp hi there root\n"), done
    late = aenv("exec", "--timeout", "1", sandbox.sandbox_id, "--", "sleep 30")
    assert late.code == 124, late
    assert len(late.errors()) == 1 and "--timeout" in late.errors()[0], late
    assert late.seconds < 20, late


def test_stdin_from_a_pipe(aenv: Cli, sandbox: Sandbox) -> None:
    text = "".join(f"line {i}\n" for i in range(20_000))  # ~200 kB: several chunks
    done = aenv("exec", sandbox.sandbox_id, "--",
                "cat > /tmp/in; sha256sum < /tmp/in; wc -l < /tmp/in", input=text)
    assert done.code == 0, done
    assert done.stdout.split()[0] == hashlib.sha256(text.encode()).hexdigest(), done
    assert done.stdout.split()[-1] == "20000", done
    # The command may end before our stdin does.
    head = aenv("exec", sandbox.sandbox_id, "--", "head", "-n", "2", input="a\nb\nc\n" * 10_000)
    assert (head.code, head.stdout) == (0, "a\nb\n"), head


def test_output_streams_before_the_end(aenv: Cli, sandbox: Sandbox) -> None:
    proc = subprocess.Popen(
        [str(AENV), "exec", sandbox.sandbox_id, "--", "echo first; sleep 4; echo second"],
        env=aenv.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        started = time.monotonic()
        first = proc.stdout.readline()
        first_at = time.monotonic() - started
        assert first == "first\n"
        assert proc.poll() is None, "the first line came only after the command ended"
        rest = proc.stdout.read()
        ended_at = time.monotonic() - started
        assert rest == "second\n"
        assert proc.wait(30) == 0
        assert ended_at - first_at > 3, (first_at, ended_at)
    finally:
        proc.kill()
        proc.wait()
