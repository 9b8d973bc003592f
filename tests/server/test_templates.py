"""Templates from OCI images through the real E2B SDK: the ``Template`` builder on images of a
real local registry, cold starts, images without bash or libc, build logs and failures.

Every image is built offline (tests/images.py) and served by a real ``docker-registry``.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException, SandboxException

from tests.images import LAYERED_FILES, LAYERED_GONE, SHELL_LESS_MESSAGE, push, ready_image
from tests.registry import AUTH, Registry, auth_registry, registry
from tests.server.harness import API_KEY, NodeServer

__all__ = ["auth_registry", "registry"]  # fixtures used below

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


@pytest.fixture(scope="module")
def images(registry: Registry) -> dict[str, str]:
    """References of the ready-made images pushed into the session registry."""
    found = {}
    for name in ("busybox", "layered", "shell-less"):
        found[name] = push(ready_image(name), registry, name).ref
    return found


def _api(server: NodeServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-API-KEY": API_KEY}, timeout=300)


def cold_start(server: NodeServer, image: str, **body: object) -> Sandbox:
    with _api(server) as api:
        response = api.post("/sandboxes-cold", json={"image": image, **body})
    assert response.status_code == 201, response.text
    return Sandbox.connect(response.json()["sandboxID"])


@pytest.fixture
def killer() -> Iterator[list[Sandbox]]:
    made: list[Sandbox] = []
    yield made
    for sbx in made:
        sbx.kill()


def _delete(server: NodeServer, name: str) -> int:
    with _api(server) as api:
        return api.delete(f"/templates/{name}").status_code


def test_cold_start_sees_the_image_as_it_is(
    server: NodeServer, images: dict[str, str], killer: list[Sandbox]
) -> None:
    sbx = cold_start(server, images["layered"], envVars={"EXTRA": "1"})
    killer.append(sbx)
    # The image's USER, WORKDIR and Env; its whiteouts and opaque directory hold.
    out = sbx.commands.run("id -un; pwd; echo $GREETING $EXTRA").stdout.split("\n")
    assert out[:3] == ["app", "/work", "hello from layered 1"]
    for path, text in LAYERED_FILES.items():
        assert sbx.files.read(f"/{path}") == text
    for gone in LAYERED_GONE:
        assert not sbx.files.exists(f"/{gone}")
    # A relative path and a command's default cwd agree: the image's WORKDIR.
    sbx.files.write("notes.txt", "mine")
    assert sbx.commands.run("cat /work/notes.txt").stdout == "mine"
    # The node's image list shows it pulled, every layer on disk, its last progress line.
    with _api(server) as api:
        listed = {i["reference"]: i for i in api.get("/images").json()}
    entry = listed[images["layered"]]
    assert entry["layers"] == entry["layersCached"] == 3


def test_cold_start_of_a_bad_or_missing_image_is_a_clear_error(
    server: NodeServer, images: dict[str, str], registry: Registry
) -> None:
    with _api(server) as api:
        missing = api.post("/sandboxes-cold", json={"image": f"{registry.host}/nope:1"})
        bad = api.post("/sandboxes-cold", json={"image": "UPPER/Case::x"})
    assert missing.status_code == 404, missing.text
    assert missing.json()["code"] == 404 and "nope" in missing.json()["message"]
    assert bad.status_code == 400 and bad.json()["code"] == 400


def test_an_image_without_a_shell_or_libc_runs_commands_and_files(
    server: NodeServer, images: dict[str, str], killer: list[Sandbox]
) -> None:
    sbx = cold_start(server, images["shell-less"])
    killer.append(sbx)
    # The SDK always sends /bin/bash -l -c: envd runs its bundled busybox shell instead.
    assert sbx.commands.run("/hello x").stdout == SHELL_LESS_MESSAGE + "arg: x\n"
    assert sbx.commands.run("echo $((6*7)); ls /data").stdout == "42\nmessage.txt\n"
    sbx.files.write("/data/new.txt", "written")
    assert sbx.files.read("/data/new.txt") == "written"
    assert {e.name for e in sbx.files.list("/data")} == {"message.txt", "new.txt"}


def test_five_cold_starts_of_one_uncached_image_pull_it_once(
    server: NodeServer, registry: Registry, killer: list[Sandbox]
) -> None:
    pushed = push(ready_image("busybox"), registry, "busybox-five", tag=f"t{time.time_ns()}")
    before = len(registry.blob_downloads())
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        sandboxes = list(pool.map(lambda _: cold_start(server, pushed.ref), range(5)))
    killer.extend(sandboxes)
    downloads = registry.blob_downloads()[before:]
    assert len(downloads) == len(set(downloads)), f"a blob was downloaded twice: {downloads}"
    for sbx in sandboxes:
        assert sbx.commands.run("echo ok").stdout == "ok\n"


def test_template_builder_from_a_registry_image(
    server: NodeServer, images: dict[str, str], tmp_path: Path, killer: list[Sandbox]
) -> None:
    (tmp_path / "app.conf").write_text("setting=1\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image(images["busybox"])
        .set_envs({"GREETING": "hello", "LEVEL": "$GREETING-2"})
        .copy("app.conf", "/srv/app/")
        .run_cmd("echo built-as-$(id -un) > /srv/app/built.txt")
        .set_user("app")
        .set_workdir("/srv/work")  # made by the step, for its user: app can write there
        .run_cmd("echo $GREETING > mine.txt")
        # The loop replaces the file (a reader never sees it half-written).
        .set_start_cmd("while true; do date > /tmp/a.new; mv /tmp/a.new /tmp/alive; "
                       "echo tick; sleep 1; done", "test -s /tmp/alive")
    )
    logs: list[str] = []
    Template.build(template, "tpl-busybox", on_build_logs=lambda e: logs.append(e.message))
    assert any("RUN echo built-as" in line for line in logs)
    assert any("memory image taken" in line for line in logs)
    assert Template.exists("tpl-busybox") and not Template.exists("tpl-none")

    sbx = Sandbox.create("tpl-busybox")
    killer.append(sbx)
    out = sbx.commands.run("id -un; pwd; echo $GREETING $LEVEL").stdout.split("\n")
    assert out[:3] == ["app", "/srv/work", "hello hello-2"]
    assert sbx.files.read("/srv/app/app.conf") == "setting=1\n"
    assert sbx.files.read("/srv/app/built.txt") == "built-as-root\n"
    assert sbx.files.read("mine.txt") == "hello\n"
    assert sbx.files.get_info("/srv/work").owner == "app"
    # COPY gave the file to the user current at the step (the image's default, root here).
    assert sbx.files.get_info("/srv/app/app.conf").owner == "root"
    # The start command was running when the memory image was taken: it still runs.
    first = sbx.files.read("/tmp/alive")
    time.sleep(1.5)
    assert sbx.files.read("/tmp/alive") != first
    # What it prints is in the sandbox's logs (envd copies the start command's output to its
    # console, docs/logs.md), read at once by the logs route.
    got = httpx.get(f"{server.url}/v2/sandboxes/{sbx.sandbox_id}/logs",
                    headers={"X-API-KEY": API_KEY}, timeout=30).json()["logs"]
    ticks = [e for e in got if e["fields"].get("source") == "start"]
    assert ticks and ticks[-1]["message"] == "tick", got
    assert ticks[-1]["fields"]["stream"] == "stdout"

    # A rebuild with one changed step re-runs from that step only.
    logs.clear()
    nonce = time.time_ns()
    changed = (
        Template(file_context_path=str(tmp_path))
        .from_image(images["busybox"])
        .set_envs({"GREETING": "hello", "LEVEL": "$GREETING-2"})
        .copy("app.conf", "/srv/app/")
        .run_cmd("echo built-as-$(id -un) > /srv/app/built.txt")
        .set_user("app")
        .set_workdir("/srv/work")
        .run_cmd(f"echo changed {nonce} > mine.txt")  # layers outlive a test session
    )
    Template.build(changed, "tpl-busybox", on_build_logs=lambda e: logs.append(e.message))
    assert logs.count("CACHED") == 2, logs  # COPY and the first RUN (WORKDIR: its layer)
    sbx2 = Sandbox.create("tpl-busybox")
    killer.append(sbx2)
    assert sbx2.files.read("/srv/work/mine.txt") == f"changed {nonce}\n"

    # A template built from this one (fromTemplate) keeps its files, user, workdir and env.
    Template.build(Template().from_template("tpl-busybox").run_cmd("echo more > more.txt"),
                   "tpl-busybox-child")
    child = Sandbox.create("tpl-busybox-child")
    killer.append(child)
    assert child.commands.run("cat mine.txt more.txt; whoami; echo $GREETING").stdout == (
        f"changed {nonce}\nmore\napp\nhello\n")
    assert _delete(server, "tpl-busybox-child") == 204

    assert _delete(server, "tpl-busybox") == 204
    assert not Template.exists("tpl-busybox")
    with pytest.raises(SandboxException, match="404: template 'tpl-busybox' not found"):
        Sandbox.create("tpl-busybox")
    assert _delete(server, "tpl-busybox") == 404


def test_a_failing_run_is_reported_with_its_step_and_exit_code(
    server: NodeServer, images: dict[str, str]
) -> None:
    template = (Template().from_image(images["busybox"])
                .run_cmd("echo fine").run_cmd("echo broken >&2; exit 7"))
    logs: list[tuple[str, str | None]] = []
    with pytest.raises(BuildException, match=r"step 2 .*exit code 7"):
        Template.build(template, "tpl-fails",
                       on_build_logs=lambda e: logs.append((e.message, getattr(e, "step", None))))
    assert ("broken", None) in logs or any(m == "broken" for m, _ in logs)
    # The failed build made no template a sandbox could start from.
    with pytest.raises(SandboxException, match="404: template 'tpl-fails' has no ready build"):
        Sandbox.create("tpl-fails")
    assert _delete(server, "tpl-fails") == 204


def test_build_status_pages_logs_and_names_the_failed_step(
    server: NodeServer, images: dict[str, str]
) -> None:
    template = Template().from_image(images["busybox"]).run_cmd(
        f"for i in 1 2 3; do echo $i; done # {time.time_ns()}")  # never cached
    info = Template.build_in_background(template, "tpl-status")
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        status = Template.get_build_status(info, logs_offset=0)
        if status.status.value in ("ready", "error"):
            break
        time.sleep(0.3)
    assert status is not None and status.status.value == "ready"
    everything = [e.message for e in status.log_entries]
    assert [m for m in everything if m in ("1", "2", "3")] == ["1", "2", "3"]
    # logsOffset pages: from an offset, exactly the rest.
    later = Template.get_build_status(info, logs_offset=2)
    assert [e.message for e in later.log_entries] == everything[2:]
    assert _delete(server, "tpl-status") == 204


def test_private_registry_credentials(
    server: NodeServer, auth_registry: Registry, killer: list[Sandbox]
) -> None:
    ref = push(ready_image("busybox"), auth_registry, "private").ref
    good = Template().from_image(ref, username=AUTH[0], password=AUTH[1]).run_cmd("true")
    Template.build(good, "tpl-private")
    sbx = Sandbox.create("tpl-private")
    killer.append(sbx)
    assert sbx.commands.run("echo ok").stdout == "ok\n"
    bad = Template().from_image(ref, username=AUTH[0], password="wrong").run_cmd("true")
    with pytest.raises(BuildException) as caught:
        Template.build(bad, "tpl-private-bad")
    assert "private" in str(caught.value)
    for name in ("tpl-private", "tpl-private-bad"):
        _delete(server, name)


def test_two_builds_of_one_name_at_once_do_not_race(
    server: NodeServer, images: dict[str, str], killer: list[Sandbox]
) -> None:
    def build(n: int) -> None:
        template = Template().from_image(images["busybox"]).run_cmd(f"echo {n} > /n.txt")
        Template.build(template, "tpl-race")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(build, (1, 2)))
    sbx = Sandbox.create("tpl-race")
    killer.append(sbx)
    assert sbx.files.read("/n.txt") in ("1\n", "2\n")
    assert _delete(server, "tpl-race") == 204


def test_skip_cache_rebuilds_and_later_builds_reuse_what_it_made(
    server: NodeServer, images: dict[str, str], killer: list[Sandbox]
) -> None:
    nonce = time.time_ns()

    def template() -> Template:
        return (Template().from_image(images["busybox"])
                .run_cmd(f"echo $(date +%s%N) {nonce} > /stamp").run_cmd("cp /stamp /copy"))

    def build(**kw: bool) -> list[str]:
        logs: list[str] = []
        Template.build(template(), "tpl-force", on_build_logs=lambda e: logs.append(e.message),
                       **kw)
        return logs

    def stamp() -> str:
        sbx = Sandbox.create("tpl-force")
        killer.append(sbx)
        assert sbx.files.read("/copy") == sbx.files.read("/stamp")
        return sbx.files.read("/stamp")

    build()
    first = stamp()
    forced = build(skip_cache=True)
    assert "CACHED" not in forced
    second = stamp()
    assert second != first
    # Nothing changed since: every step and the memory image come from the forced build.
    again = build()
    assert again.count("CACHED") == 2
    assert "CACHED memory image (nothing changed)" in again
    assert stamp() == second
    assert _delete(server, "tpl-force") == 204
