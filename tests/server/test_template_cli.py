"""``aenv template build|pull|ls|rm`` end to end: the CLI as a subprocess against a real node.

Images come from a real local registry (``tests.registry``), the builds run in real gVisor build
sandboxes, and what they made is checked with the E2B SDK in sandboxes of the templates. The
multi-stage build is made once per module (fixture ``built``) and then rebuilt unchanged. The
CLI's stdout is its result (a template id, a table, JSON); the build's log streams on stderr.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException, Template

from tests.cli_run import Cli, Result
from tests.images import push, ready_image
from tests.registry import Registry, needs_registry, registry
from tests.server.harness import NodeServer

__all__ = ["registry"]  # the fixture, imported for its use below

pytestmark = needs_registry

CLI_TIMEOUT_S = 300


def aenv(server: NodeServer, *args: str, cwd: Path | None = None) -> Result:
    """``aenv template <args>`` with the node's URL and key in its environment."""
    return Cli(server, timeout_s=CLI_TIMEOUT_S)("template", *args, cwd=cwd)


def show(result: Result) -> str:
    return str(result)


@pytest.fixture(scope="module")
def busybox_ref(registry: Registry) -> str:
    return push(ready_image("busybox"), registry, "cli/busybox").ref


MULTI_STAGE = """\
ARG GREETING=hello
FROM {base} AS maker
ARG GREETING
ARG TARGET_NAME=nobody
ARG RUN_ID
RUN mkdir -p /out && echo "$GREETING, $TARGET_NAME" > /out/made.txt && echo $RUN_ID > /out/id

FROM {base}
COPY --from=maker /out/made.txt /opt/app/made.txt
COPY app.txt /opt/app/
COPY --chown=app:app . /opt/ctx/
ENV APP_HOME=/opt/app APP_MODE=e2e
ENV APP_DATA=${{APP_HOME}}/data
WORKDIR /opt/app/work
USER app
CMD ["sh", "-c", "while true; do date +%s > /tmp/a.new; mv /tmp/a.new /tmp/alive; sleep 1; done"]
"""


@dataclass(frozen=True)
class Built:
    name: str
    context: Path
    args: tuple[str, ...]
    first: Result


@pytest.fixture(scope="module")
def built(server: NodeServer, busybox_ref: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Built:
    context = tmp_path_factory.mktemp("multi-stage")
    (context / "Dockerfile").write_text(MULTI_STAGE.format(base=busybox_ref))
    (context / "app.txt").write_text("from the context\n")
    (context / "secret.txt").write_text("must not be uploaded\n")
    (context / "sub").mkdir()
    (context / "sub" / "kept.txt").write_text("kept\n")
    (context / ".dockerignore").write_text("secret.txt\n")
    name = "cli-multi"
    # The node's layer store is the machine's test cache, shared by test sessions: a RUN_ID of
    # this session's own makes the first build really run its steps.
    args = ("--build-arg", "TARGET_NAME=world", "--build-arg", f"RUN_ID={secrets.token_hex(8)}")
    first = aenv(server, "build", "--name", name, *args, str(context))
    assert first.code == 0, show(first)
    return Built(name, context, args, first)


@pytest.fixture
def multi_sandbox(built: Built) -> Iterator[Sandbox]:
    sbx = Sandbox.create(built.name, timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


def run(sbx: Sandbox, cmd: str) -> str:
    return sbx.commands.run(cmd, timeout=30).stdout.strip()


def test_multi_stage_build(built: Built, multi_sandbox: Sandbox) -> None:
    result = built.first
    # stdout: the template id alone (for scripts); the build's log streams on stderr.
    assert len(result.stdout.split()) == 1, show(result)
    assert "CACHED" not in result.stderr, show(result)
    for expected in ("0.1 RUN ", "mkdir -p /out", "COPY /out/made.txt /opt/app/made.txt",
                     "ENV APP_DATA=/opt/app/data",
                     "WORKDIR /opt/app/work", "USER app", "start command", "memory image taken",
                     f"built {built.name} in"):
        assert expected in result.stderr, (expected, show(result))
    assert "secret.txt" not in result.stderr

    sbx = multi_sandbox
    assert run(sbx, "cat /opt/app/made.txt") == "hello, world"  # ARG default and --build-arg
    assert run(sbx, "cat /opt/app/app.txt") == "from the context"
    assert run(sbx, "cat /opt/ctx/sub/kept.txt") == "kept"
    assert run(sbx, "ls -A /opt/ctx | sort").split() == [".dockerignore", "Dockerfile",
                                                         "app.txt", "sub"]
    # COPY without --chown: root's, as Docker; with it: the named user's.
    assert run(sbx, "stat -c %u:%g /opt/app/made.txt /opt/app/app.txt").split() == ["0:0"] * 2
    assert run(sbx, "stat -c %u:%g /opt/ctx/app.txt /opt/ctx/sub") == "1234:1234\n1234:1234"
    assert run(sbx, "echo $APP_MODE $APP_DATA") == "e2e /opt/app/data"
    assert run(sbx, "pwd") == "/opt/app/work"
    assert run(sbx, "whoami; id -u") == "app\n1234"
    # The start command (CMD) was restored running: its loop keeps refreshing the marker.
    first = int(run(sbx, "cat /tmp/alive"))
    time.sleep(2.2)
    assert int(run(sbx, "cat /tmp/alive")) > first
    assert "while true" in run(sbx, "ps -o args")


def test_unchanged_rebuild_is_cached(server: NodeServer, built: Built) -> None:
    again = aenv(server, "build", "--name", built.name, *built.args, str(built.context))
    assert again.code == 0, show(again)
    assert "context: already on the node" in again.stderr, show(again)
    cached = {line.split()[0] for line in again.stderr.splitlines()
              if line.strip().endswith("CACHED")}
    # The RUN of stage 0 and the three COPYs and the WORKDIR of the final stage.
    assert {"0.1", "1", "2", "3"} <= cached, show(again)
    print(f"first build {built.first.seconds:.1f} s, unchanged rebuild {again.seconds:.1f} s")
    assert again.seconds < built.first.seconds, (again.seconds, built.first.seconds)
    sbx = Sandbox.create(built.name, timeout=60)  # the new build's memory image
    try:
        assert run(sbx, "cat /opt/app/made.txt; whoami") == "hello, world\napp"
    finally:
        sbx.kill()


def test_failing_run(server: NodeServer, busybox_ref: str, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {busybox_ref}
        RUN echo before
        RUN echo about to fail && exit 7
        RUN echo never
        """))
    result = aenv(server, "build", "--name", "cli-fails", str(tmp_path))
    assert result.code == 1, show(result)
    assert result.stdout == "", show(result)
    assert "about to fail" in result.stderr, show(result)  # the step's output was streamed
    assert result.errors() == [
        "error: build of cli-fails failed: step 2 (RUN echo about to fail && exit 7) failed: "
        "exit code 7"], show(result)
    assert "echo never" not in result.stderr
    assert aenv(server, "rm", "cli-fails").code == 0


def test_pull_ls_rm(server: NodeServer, busybox_ref: str) -> None:
    name = "cli-pulled"
    pulled = aenv(server, "pull", busybox_ref, "--name", name)
    assert pulled.code == 0, show(pulled)
    template_id = pulled.stdout.strip()
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert sbx.commands.run("echo hi").stdout == "hi\n"
    finally:
        sbx.kill()

    listed = aenv(server, "ls")
    assert listed.code == 0, show(listed)
    row = next(line for line in listed.stdout.splitlines() if template_id in line)
    assert name in row and "ready" in row, listed.stdout
    as_json = aenv(server, "ls", "--json")
    assert as_json.code == 0, show(as_json)
    [entry] = [t for t in json.loads(as_json.stdout) if t["templateID"] == template_id]
    assert name in (entry.get("names") or entry.get("aliases") or []), entry

    removed = aenv(server, "rm", name)
    assert removed.code == 0, show(removed)
    assert removed.stdout.strip() == template_id
    assert not Template.exists(name)
    with pytest.raises(SandboxException) as gone:  # the SDK's class for a 404 of create
        Sandbox.create(name, timeout=30)
    assert gone.value.status_code == 404, gone.value
    assert template_id not in aenv(server, "ls").stdout


def test_rm_unknown(server: NodeServer) -> None:
    result = aenv(server, "rm", "no-such-template")
    assert result.code != 0, show(result)
    assert result.errors() == ["error: template 'no-such-template' not found"], show(result)
    assert "Traceback" not in result.stderr


def test_syntax_error_before_upload(server: NodeServer, busybox_ref: str, tmp_path: Path
                                    ) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {busybox_ref}\nRUN echo ok\nFROBNICATE now\n")
    result = aenv(server, "build", "--name", "cli-bad-syntax", str(tmp_path))
    assert result.code != 0, show(result)
    assert result.errors() == [
        f"error: {tmp_path / 'Dockerfile'}: line 3: FROBNICATE: unknown instruction"], show(result)
    assert "context:" not in result.stderr, show(result)  # nothing was packed nor sent
    assert not Template.exists("cli-bad-syntax")


def test_debian_http_server(server: NodeServer, registry: Registry, tmp_path: Path) -> None:
    """A shell-form CMD under bash: a Python web server serving a COPY'd file as its user."""
    debian = push(ready_image("debian"), registry, "cli/debian").ref  # skips without the layer
    (tmp_path / "index.html").write_text("served by the start command\n")
    (tmp_path / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {debian}
        RUN useradd --create-home --uid 2000 web
        WORKDIR /srv/site
        COPY --chown=web index.html ./
        USER web
        ENV PORT=8080
        CMD exec python3 -m http.server "$PORT" --bind 127.0.0.1
        """))
    result = aenv(server, "build", "--name", "cli-debian", str(tmp_path))
    assert result.code == 0, show(result)
    sbx = Sandbox.create("cli-debian", timeout=60)
    try:
        # No ready command: the server may bind just after the memory image was taken.
        fetch = ("for i in $(seq 50); do python3 -c \"import urllib.request as u; print(u.urlopen("
                 "'http://127.0.0.1:8080/index.html').read().decode(), end='')\" 2>/dev/null "
                 "&& exit 0; sleep 0.2; done; exit 1")
        assert run(sbx, fetch) == "served by the start command"
        assert run(sbx, "whoami; pwd; stat -c %U index.html") == "web\n/srv/site\nweb"
        assert "http.server" in run(sbx, "ps -o args= -u web")
    finally:
        sbx.kill()
    assert aenv(server, "rm", "cli-debian").code == 0
