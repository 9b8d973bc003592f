"""The official E2B JS SDK (npm ``e2b``, pinned in tests/js/package.json) against envd.

The Python SDK is the main conformance suite; this smoke test covers what only the JS SDK
exercises: connect-web's stricter stream framing (the EndStreamResponse frame, exact content
types), single-envelope stream requests and the streaming ``WatchDir``. The checks themselves
live in tests/js/smoke.mjs, which prints a JSON summary; this test installs the npm
dependencies on first use, starts its own envd (so the session envd's state cannot leak in),
runs the script in debug mode pointed at that envd, and fails with the per-check errors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.envd.harness import EnvdSandbox, start_envd
from tests.js_sdk import JS_DIR, NPM_TIMEOUT_S, ensure_node_modules

SMOKE_TIMEOUT_S = 180

pytestmark = [
    pytest.mark.js,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.timeout(NPM_TIMEOUT_S + SMOKE_TIMEOUT_S + 60),
]


@pytest.fixture
def own_envd() -> Iterator[EnvdSandbox]:
    """A fresh envd for this test only (same bundle selection as the session fixture)."""
    bundle = os.environ.get("AENV_TEST_BUNDLE")
    sandbox = start_envd(free_port(), bundle=Path(bundle) if bundle else None)
    try:
        yield sandbox
    finally:
        sandbox.stop()


def test_js_sdk_smoke(own_envd: EnvdSandbox) -> None:
    ensure_node_modules()
    env = {
        **os.environ,
        "E2B_DEBUG": "true",
        "E2B_SANDBOX_URL": own_envd.url,
        # Debug mode needs no key; make sure a developer's real one is never sent anywhere.
        "E2B_API_KEY": "",
    }
    result = subprocess.run(
        ["node", "smoke.mjs"],
        cwd=JS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )
    try:
        summary = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"smoke.mjs exited {result.returncode} without a JSON summary\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\nenvd log:\n{own_envd.log()}"
        )
    failed = [f"{c['name']}: {c.get('error')}" for c in summary["checks"] if not c["ok"]]
    if result.returncode != 0 or not summary["ok"] or failed:
        # pytest.fail rather than assert: the introspected CompletedProcess would bury the reasons.
        pytest.fail(
            f"JS SDK smoke failed (exit {result.returncode}):\n  "
            + "\n  ".join(failed)
            + f"\nenvd log (tail):\n{own_envd.log()[-3000:]}",
            pytrace=False,
        )
    # Every check ran (a crash part-way would otherwise look like success with fewer checks).
    names = {c["name"] for c in summary["checks"]}
    assert {
        "run echo",
        "stream error: connect(999999) -> NotFoundError",
        "watchDir receives an event",
    } <= names
