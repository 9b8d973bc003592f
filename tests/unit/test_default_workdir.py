"""A template without WORKDIR is representable end to end: no ``--workdir`` for envd, no
``defaultWorkdir`` in ``/init``, ``None`` in new manifests; old manifests still read."""

from __future__ import annotations

import json
from pathlib import Path

from aenv.orchestrator.deps import Template
from aenv.orchestrator.ops.boot import sandbox_spec
from aenv.storage.repository import SnapshotManifest


def _args(template: Template) -> tuple[str, ...]:
    return sandbox_spec("s" * 20, Path("/r"), Path("/b"), template, 1, 256).envd_args


def test_envd_gets_a_workdir_only_when_the_template_has_one() -> None:
    plain = Template(template_id="t", alias=None, layers=())
    assert plain.default_workdir is None
    assert _args(plain) == ("--user", "user")
    app = Template(template_id="t", alias=None, layers=(), default_workdir="/app")
    assert _args(app) == ("--user", "user", "--workdir", "/app")


def test_manifests_without_and_with_an_old_default_workdir() -> None:
    fields = {"snapshot_id": "x", "template_id": "base", "created_at": 1.0, "layers": [],
              "envd_bundle": {"digest": "sha256:" + "0" * 64, "size": 1},
              "cpu_count": 1, "memory_mb": 256}
    assert SnapshotManifest.model_validate_json(json.dumps(fields)).default_workdir is None
    # Written before None existed: the image's envd holds /home/user, so that stays.
    old = SnapshotManifest.model_validate_json(json.dumps({**fields, "default_workdir":
                                                            "/home/user"}))
    assert old.default_workdir == "/home/user"
    assert SnapshotManifest(**fields).model_dump()["default_workdir"] is None  # type: ignore[arg-type]
