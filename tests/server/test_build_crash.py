"""kill -9 of the node in the middle of a template build and of a cold start's pull or unpack,
then a restart on the same home: nothing half-made stays, nothing of the cut-short work runs.

- A build killed while its RUN step runs in a build sandbox reads ``error`` ("the node
  restarted during the build") after the restart; no runsc process of the build sandbox
  survives (the only ones left are the warm sandboxes the restarted node reports), no mount of
  it or of the build's scratch is left, and a new build of the same name succeeds.
- A cold start killed while its image is pulled, or while its layer is unpacked: after the
  restart the layer store's ``.staging`` and the pulls' work directories are empty, the layer is
  either absent or complete (it appears by rename), and the image cold-starts with its files
  intact.

The node gets a layer store of its own (``layers_dir``), so its staging area can be inspected:
test servers share one by default.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.template.types import BuildInfo, TemplateBuildStatusResponse

from aenv.orchestrator.builder import RESTARTED
from aenv.storage.mounts import read_mountinfo
from tests.images import build_image, directory, file, push, ready_image
from tests.registry import Registry, registry
from tests.server.crash_node import CrashableNode, crashable, entries_of, outcomes_of, wait_for
from tests.server.harness import leaked_sandboxes
from tests.server.test_layer_cache_node import api, own_layers_dir

__all__ = ["registry"]  # fixture, imported to be used

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

WARM = 2
STARTED = "run-step-started"
COLD_PAYLOAD = 40 << 20
_RUNTIME_DIR = re.compile(r"/runtime/([a-z0-9]{20})/")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashableNode]:
    layers = tmp_path_factory.mktemp("build-crash") / "layers"
    own_layers_dir(layers)
    with crashable(layers_dir=str(layers), warm_pool_size=str(WARM)) as crash_node:
        yield crash_node


def layers_of(node: CrashableNode) -> Path:
    return Path(node.server.env["AENV_LAYERS_DIR"])


def runsc_sandboxes(home: Path) -> dict[str, set[int]]:
    """Sandbox id → pids of the runsc processes (sandbox, gofer, …) running for it."""
    found: dict[str, set[int]] = {}
    for pid in leaked_sandboxes(home):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        match = _RUNTIME_DIR.search(cmdline)
        if match:
            found.setdefault(match.group(1), set()).add(pid)
    return found


def warm_reported(node: CrashableNode) -> set[str]:
    """The warm sandboxes the node's log (since the last restart) says it made."""
    return set(re.findall(r"warm sandbox (\w+) ready", node.log_since_restart()))


def wait_for_warm_pool(node: CrashableNode) -> set[str]:
    wait_for(lambda: len(warm_reported(node)) >= WARM, 60, "the warm pool")
    return warm_reported(node)


def mount_points() -> list[str]:
    return [m.mount_point for m in read_mountinfo()]


def build_status(info: BuildInfo) -> TemplateBuildStatusResponse:
    status: TemplateBuildStatusResponse = Template.get_build_status(info, logs_offset=0)
    return status


def test_kill9_during_a_build_step(node: CrashableNode, registry: Registry) -> None:
    busybox = push(ready_image("busybox"), registry, "busybox").ref
    name = "crash-build"
    warm = wait_for_warm_pool(node)
    before = set(runsc_sandboxes(node.home))
    template = Template().from_image(busybox).run_cmd(
        f"echo {STARTED}; sleep 30 # {secrets.token_hex(4)}")
    info = Template.build_in_background(template, name)

    def run_started() -> bool:
        return any(e.message == STARTED for e in build_status(info).log_entries)

    wait_for(run_started, 60, "the RUN step's first output")
    builders = {sid: pids for sid, pids in runsc_sandboxes(node.home).items()
                if sid not in before | warm}
    assert len(builders) == 1, f"no single build sandbox among {runsc_sandboxes(node.home)}"
    [(build_sid, build_pids)] = builders.items()
    assert any(build_sid in m for m in mount_points()), "the build sandbox has no rootfs mounted"

    node.kill9()
    node.restart()

    status = build_status(info)
    assert status.status.value == "error", status
    assert status.reason is not None and status.reason.message == RESTARTED, status.reason

    # Only the warm sandboxes the restarted node reports run; nothing of the build sandbox.
    def only_warm() -> bool:
        running = set(runsc_sandboxes(node.home))
        return running <= warm_reported(node) and len(running) == WARM

    wait_for(only_warm, 60, "a runtime of nothing but the new warm pool")
    assert build_sid not in runsc_sandboxes(node.home)
    alive = [pid for pid in build_pids if Path(f"/proc/{pid}").exists()]
    assert not alive, f"runsc processes of the build sandbox survived: {alive}"
    scratch = str(node.home / "build" / "scratch")
    left = [m for m in mount_points() if build_sid in m or m.startswith(scratch)]
    assert not left, f"mounts left by the build: {left}"
    assert not (node.home / "sandboxes" / build_sid).exists()

    # The name is free to build again, and what it builds works.
    Template.build(Template().from_image(busybox).run_cmd("echo rebuilt > /rebuilt.txt"), name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sbx.files.read("/rebuilt.txt") == "rebuilt\n"
        assert sbx.commands.run("echo ok", timeout=30).stdout == "ok\n"
    finally:
        sbx.kill()


def _pull_started(node: CrashableNode) -> bool:
    """skopeo's work directory for the pull exists (the request got as far as the pull)."""
    return bool(entries_of(node.home / ".pulls"))


def _unpacking(node: CrashableNode) -> bool:
    """The layer's staging directory exists: the blob is being unpacked into it."""
    return bool(entries_of(layers_of(node) / ".staging"))


@pytest.mark.parametrize("kill_when", [_pull_started, _unpacking], ids=["pull", "unpack"])
def test_kill9_during_a_cold_start(
    node: CrashableNode, registry: Registry, tmp_path: Path,
    kill_when: Callable[[CrashableNode], bool],
) -> None:
    payload = os.urandom(COLD_PAYLOAD)
    built = build_image(tmp_path / "image", [[
        directory("data"), file("data/name.txt", "cold"), file("data/payload", payload),
    ]], {"Env": ["PATH=/bin"]}, compresslevel=1)
    ref = push(built, registry, "crash-cold", tag=secrets.token_hex(4)).ref
    layer = layers_of(node) / built.layers[0].diff_id.removeprefix("sha256:")

    def send() -> httpx.Response:
        with api(node.server) as client:
            return client.post("/sandboxes-cold", json={"image": ref, "timeout": 120})

    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(send)
        wait_for(lambda: kill_when(node), 60, f"the cold start's {kill_when.__name__}", call)
        node.kill9()
        [outcome] = outcomes_of([call])
    assert not isinstance(outcome, httpx.Response), \
        f"the cold start ended before the kill: {outcome.status_code} {outcome.text}"
    node.restart()

    # Nothing a killed pull or unpack left survives the start; no layer is half there.
    assert entries_of(layers_of(node) / ".staging") == []
    assert entries_of(node.home / ".pulls") == []
    assert not layer.exists() or (layer / "data" / "payload").stat().st_size == COLD_PAYLOAD

    with api(node.server) as client:
        response = client.post("/sandboxes-cold", json={"image": ref, "timeout": 120})
    assert response.status_code == 201, response.text
    sbx = Sandbox.connect(response.json()["sandboxID"])
    try:
        out = sbx.commands.run("cat /data/name.txt; echo; sha256sum /data/payload", timeout=60)
        assert out.stdout.split()[:2] == ["cold", hashlib.sha256(payload).hexdigest()]
    finally:
        sbx.kill()
