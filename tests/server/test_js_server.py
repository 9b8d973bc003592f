"""The official JS SDK against the node server: create, run, files, kill."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.js_sdk import JS_DIR, ensure_node_modules
from tests.server.harness import NodeServer, client_env

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.js]

def test_js_sdk_against_the_server(server: NodeServer) -> None:
    node = shutil.which("node")
    assert node, "node is required (make test installs it)"
    ensure_node_modules()
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(client_env(server))
    done = subprocess.run(
        [node, "server_smoke.mjs"], cwd=JS_DIR, env=env, capture_output=True, text=True,
        timeout=180,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary; stdout={done.stdout!r} stderr={done.stderr[-2000:]!r}"
    summary = json.loads(lines[-1])
    assert summary["ok"], summary
    assert done.returncode == 0
