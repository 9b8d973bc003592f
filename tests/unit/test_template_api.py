"""The template-build routes over their operations (``orchestrator/ops/template_*.py``), in
process: a real FastAPI app and a real SQLite template store, a recording builder (no build
runs) and an in-memory repository. What a real build does is ``tests/server/test_templates.py``'s.

Pins the status codes and messages the handlers answered with before their work moved into
the operations, and the one timeout check (``core/timeouts.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from aenv.api.app import build_api
from aenv.core.errors import InvalidArgument, NotEnoughSpace
from aenv.core.settings import Settings
from aenv.core.timeouts import check_timeout, timeout_or_default
from aenv.orchestrator.activity import Activity
from aenv.orchestrator.audit import AuditTrail
from aenv.orchestrator.ops import template_files
from aenv.orchestrator.team_directory import LocalDirectory
from aenv.orchestrator.tenancy import Tenancy
from aenv.store.audit import AuditStore
from aenv.store.sqlite import Store
from aenv.store.templates import TemplateStore
from aenv.store.tenancy import TenancyStore

pytestmark = pytest.mark.anyio

KEY = "e2b_" + "0" * 40
HASH = "a" * 64


@dataclass
class RecordingBuilder:
    """The builder's surface the operations use; ``start`` records instead of building."""

    files_dir: Path
    requested_tags: dict[str, list[str]] = field(default_factory=dict)
    started: list[tuple[str, list[str], Any]] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)

    def running(self, build_id: str) -> bool:
        return build_id in self.busy

    def start(self, template: Any, build: Any, plan: Any, *, tags: Sequence[str] = (),
              auth: tuple[str, str] | None = None) -> None:
        self.started.append((build.build_id, list(tags), auth))


@dataclass
class Repo:
    """Snapshots by id: what ``delete_template`` asks of the repository."""

    snapshots: dict[str, Any] = field(default_factory=dict)

    def get(self, snapshot_id: str) -> Any:
        return self.snapshots.get(snapshot_id)

    def find(self, name_or_id: str) -> Any:
        return self.snapshots.get(name_or_id)

    def list(self, kind: str | None = "snapshot") -> list[Any]:
        return [s for s in self.snapshots.values() if s.manifest.kind == kind]

    async def lookup(self, name_or_id: str) -> Any:
        return self.snapshots.get(name_or_id)

    def pending_draft(self, name_or_id: str) -> Any:
        return None  # every snapshot here is committed

    async def delete(self, snapshot_id: str) -> None:
        del self.snapshots[snapshot_id]


def _snapshot(snapshot_id: str, kind: str) -> Any:
    return SimpleNamespace(snapshot_id=snapshot_id,
                           manifest=SimpleNamespace(kind=kind, team_id=None, names=[],
                                                    template_id=snapshot_id))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Any]:
    store = await Store.open(tmp_path / "state.db")
    settings = Settings(home=tmp_path, max_upload_bytes=1000, max_timeout_s=3600)
    tenancy = Tenancy(LocalDirectory(TenancyStore(store.db)), TenancyStore(store.db))
    await tenancy.start(KEY)
    yield SimpleNamespace(
        tenancy=tenancy, store=store,
        settings=settings, template_store=TemplateStore(store.db),
        builder=RecordingBuilder(tmp_path / "build" / "files"), repository=Repo(),
        images=None, activity=Activity(), build_dir=tmp_path / "build",
        audit=AuditTrail(AuditStore(store.db), keep=1000), clock=time.time)
    await store.close()


@pytest.fixture
async def api(node: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = build_api(node, KEY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node",
                                 headers={"X-API-KEY": KEY}) as client:
        yield client


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status
    return str(body["message"])


async def _requested(api: httpx.AsyncClient, name: str = "app") -> dict[str, Any]:
    response = await api.post("/v3/templates", json={"name": name, "cpuCount": 1})
    assert response.status_code == 202, response.text
    return dict(response.json())


async def test_request_upload_start_status(api: httpx.AsyncClient, node: Any) -> None:
    asked = await _requested(api, "app:v1")
    assert asked["names"] == ["app"] and asked["tags"] == ["v1"]
    template_id, build_id = asked["templateID"], asked["buildID"]
    # Audited as answered: the request named by the template it made (docs/audit.md).
    [entry] = await node.audit.query(limit=10)
    assert (entry.action, entry.object_id, entry.status) == ("POST /v3/templates",
                                                             template_id, 202)
    assert node.builder.requested_tags[build_id] == ["v1"]

    link = (await api.get(f"/templates/{template_id}/files/{HASH}")).json()
    assert link["present"] is False
    url = httpx.URL(link["url"])
    bad = url.copy_set_param("signature", "0" * 64)
    assert "signature" in _error(await api.put(bad, content=b"x", headers={}), 403)
    assert (await api.put(url, content=b"tarball")).status_code == 201
    assert (node.builder.files_dir / HASH).read_bytes() == b"tarball"
    assert not list(node.builder.files_dir.glob(".upload-*"))
    assert (await api.get(f"/templates/app/files/{HASH}")).json() == {"present": True}

    step = {"type": "COPY", "args": ["src", "/app"], "filesHash": "b" * 64}
    body = {"fromImage": "debian:12", "steps": [step],
            "fromImageRegistry": {"username": "u", "password": "p"}}
    message = _error(await api.post(f"/v2/templates/app/builds/{build_id}", json=body), 400)
    assert "were not uploaded" in message
    body["steps"] = [{**step, "filesHash": HASH}]
    assert (await api.post(f"/v2/templates/app/builds/{build_id}", json=body)).status_code == 202
    assert node.builder.started == [(build_id, ["v1"], ("u", "p"))]
    assert build_id not in node.builder.requested_tags

    await node.template_store.append_log(build_id, "info", "hello", "base")
    status = (await api.get(f"/templates/{template_id}/builds/{build_id}/status")).json()
    assert status["status"] == "waiting" and status["logs"][0].endswith("] hello")
    assert status["logEntries"][0]["step"] == "base"
    assert "level must be" in _error(
        await api.get(f"/templates/app/builds/{build_id}/status?level=loud"), 400)
    assert "not found" in _error(await api.get(f"/templates/nope/builds/{build_id}/status"), 404)


async def test_bad_names_and_a_started_build(api: httpx.AsyncClient, node: Any) -> None:
    for name in ("base", "Upper", "app:bad tag"):
        _error(await api.post("/v3/templates", json={"name": name}), 400)
    asked = await _requested(api)
    node.builder.busy.add(asked["buildID"])
    body = {"fromImage": "debian:12"}
    message = _error(await api.post(f"/v2/templates/app/builds/{asked['buildID']}", json=body),
                     409)
    assert "already started" in message
    dockerfile = {"dockerfile": "FROM debian:12\n"}
    asked = await _requested(api)
    message = _error(await api.post(f"/v2/templates/app/builds/{asked['buildID']}",
                                    json=dockerfile), 400)
    assert "contextHash" in message


async def test_upload_limits_leave_nothing(api: httpx.AsyncClient, node: Any) -> None:
    asked = await _requested(api)
    url = httpx.URL((await api.get(f"/templates/{asked['templateID']}/files/{HASH}"))
                    .json()["url"])
    assert "exceeds the limit" in _error(await api.put(url, content=b"x" * 1001), 507)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * 400

    with pytest.raises(NotEnoughSpace):
        await template_files.receive_files(node, HASH, chunks())
    assert not (node.builder.files_dir / HASH).exists()
    assert not list(node.builder.files_dir.glob(".upload-*"))


async def test_a_cancelled_upload_leaves_no_partial_file(node: Any) -> None:
    more = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 10
        await more.wait()
        yield b"never"

    task = asyncio.create_task(template_files.receive_files(node, HASH, chunks()))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not list(node.builder.files_dir.iterdir())


async def test_tags_list_alias_and_delete(api: httpx.AsyncClient, node: Any) -> None:
    asked = await _requested(api)
    store, template_id, build_id = node.template_store, asked["templateID"], asked["buildID"]
    build = await store.require_build(template_id, build_id)
    await store.set_build_status(build, "ready", snapshot_id="snap1")
    await store.set_tag(template_id, "default", build_id)
    node.repository.snapshots["snap1"] = _snapshot("snap1", "template")

    assert (await api.get("/templates/aliases/app")).json()["templateID"] == template_id
    assert "alias 'nope' not found" in _error(await api.get("/templates/aliases/nope"), 404)
    listed = (await api.get("/templates")).json()
    assert [(t["buildID"], t["buildStatus"], t["buildCount"]) for t in listed] == [
        (build_id, "ready", 1)]

    assigned = await api.post("/templates/tags", json={"target": "app", "tags": ["v2"]})
    assert assigned.status_code == 201 and assigned.json()["buildID"] == build_id
    _error(await api.post("/templates/tags", json={"target": "app:nope", "tags": ["x"]}), 404)
    tags = {t["tag"] for t in (await api.get(f"/templates/{template_id}/tags")).json()}
    assert tags == {"default", "v2"}
    removal = {"name": "app", "tags": ["v2", "default"]}
    assert "default tag" in _error(await api.request("DELETE", "/templates/tags", json=removal),
                                   400)
    assert len(await store.tags(template_id)) == 2  # nothing removed by the refused call
    removal["tags"] = ["v2"]
    assert (await api.request("DELETE", "/templates/tags", json=removal)).status_code == 204

    node.builder.busy.add(build_id)
    assert "being built" in _error(await api.delete("/templates/app"), 409)
    node.builder.busy.clear()
    assert (await api.delete("/templates/app")).status_code == 204
    assert await store.get_template("app") is None and not node.repository.snapshots
    assert "not found" in _error(await api.delete("/templates/app"), 404)


async def test_delete_of_a_snapshot_template(api: httpx.AsyncClient, node: Any) -> None:
    node.repository.snapshots["mine"] = _snapshot("mine", "snapshot")
    node.repository.snapshots["paused1"] = _snapshot("paused1", "paused")
    assert (await api.delete("/templates/mine")).status_code == 204
    assert "mine" not in node.repository.snapshots
    assert "not found" in _error(await api.delete("/templates/paused1"), 404)
    assert "paused1" in node.repository.snapshots


def test_one_timeout_check() -> None:
    settings = Settings(max_timeout_s=60, default_timeout_s=30)
    assert check_timeout(settings, 0) == 0 and check_timeout(settings, 60) == 60
    assert timeout_or_default(settings, None) == 30
    with pytest.raises(InvalidArgument, match=r"^timeout 61s exceeds the maximum of 60s$"):
        timeout_or_default(settings, 61)
    with pytest.raises(InvalidArgument):
        check_timeout(settings, -1)


async def test_timeouts_on_the_wire(api: httpx.AsyncClient) -> None:
    # The bound is checked before anything else: no sandbox, template or runtime is needed.
    too_long = {"templateID": "base", "timeout": 3601}
    assert _error(await api.post("/v2/sandboxes", json=too_long), 400) == (
        "timeout 3601s exceeds the maximum of 3600s")
    assert "greater than or equal to 0" in _error(
        await api.post("/v2/sandboxes", json={"templateID": "base", "timeout": -1}), 400)
    assert "exceeds the maximum" in _error(
        await api.post("/sandboxes-cold", json={"image": "debian", "timeout": 3601}), 400)
    assert "exceeds the maximum" in _error(
        await api.post(f"/v2/sandboxes/{'a' * 20}/connect", json={"timeout": 3601}), 400)
    assert "exceeds the maximum" in _error(
        await api.post(f"/sandboxes/{'a' * 20}/timeout", json={"timeout": 3601}), 400)
