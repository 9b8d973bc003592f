"""The official JS SDK's ``Template`` builder against the node server: a template from a
registry image (COPY, RUN, ENV, USER, WORKDIR, start and ready commands), build logs,
``Template.exists``, a sandbox of it, a failing RUN, and a DELETE (tests/js/template_smoke.mjs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.images import push, ready_image
from tests.js_sdk import JS_DIR, ensure_node_modules
from tests.registry import Registry, registry
from tests.server.harness import NodeServer, client_env

__all__ = ["registry"]  # fixture used below

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.js]


def test_js_template_builder_against_the_server(server: NodeServer, registry: Registry) -> None:
    node = shutil.which("node")
    assert node, "node is required (make test installs it)"
    ensure_node_modules()
    image = push(ready_image("busybox"), registry, "busybox").ref
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(client_env(server))
    env["AENV_IMAGE"] = image
    done = subprocess.run(
        [node, "template_smoke.mjs"],
        cwd=JS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary; stdout={done.stdout!r} stderr={done.stderr[-2000:]!r}"
    summary = json.loads(lines[-1])
    print(summary)
    assert summary["ok"], summary
    assert done.returncode == 0
