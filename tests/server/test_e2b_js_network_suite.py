"""E2B's own JS SDK tests of networking, iam, sandbox hosts and secrets
(``packages/js-sdk/tests/sandbox/{network,networkTransform,iam,host}.test.ts`` and
``packages/js-sdk/tests/secret/secret.test.ts`` of the e2b repository), case by case through
the official ``e2b`` npm package (tests/js/network_suite.mjs) against one real node.

The node and the world are those of the Python ports (test_e2b_network_suite.py): the public
addresses their cases reach (``https://1.1.1.1`` answering 301, ``https://8.8.8.8`` 302) and
``allowed.test`` stood up on this machine (tests/network/egress_world.py, ``public=True``),
the node resolving with the world's DNS server only and trusting the world's CA upstream; the
script puts that CA in each sandbox's trust as a public CA is in an image's. The node also
serves sandbox hostnames over HTTPS with a wildcard certificate for ``*.aenv.test``
(test_inbound_https.py), which the script reaches as ``https://<getHost>``, resolving
``*.aenv.test:443`` to the listener itself (the deployment's DNS record) and checking the
certificate against the test CA.

Where theirs mock the API and inspect the request body (iam, networkTransform), a recorder
in front of the node keeps the body and the real node answers; their secret cases run against
the node's secrets API. One run of the script for the module; a test per ported file reports
its cases (``xfail``: a known gap, listed, not failed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.certs import issue
from tests.conftest import free_port
from tests.js_sdk import JS_DIR, ensure_node_modules
from tests.network.egress_world import PUBLIC, World, egress_world
from tests.network.peers import InternetPeer
from tests.server.harness import NodeServer, client_env, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.js, pytest.mark.timeout(900)]

DOMAIN = "aenv.test"
SCRIPT_TIMEOUT_S = 600
FILES = ("network", "networkTransform", "iam", "host", "secret")


@pytest.fixture(scope="module")
def peer() -> Iterator[InternetPeer]:
    made = InternetPeer()
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def world(peer: InternetPeer) -> Iterator[World]:
    with egress_world(peer, public=True) as made:
        yield made


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return issue(tmp_path_factory.mktemp("tls"), [f"*.{DOMAIN}", DOMAIN])


@pytest.fixture(scope="module")
def node(world: World, tls: tuple[Path, Path, Path]) -> Iterator[NodeServer]:
    cert, key, _ = tls
    port = free_port()
    with serving(egress_resolvers=json.dumps([world.dns_ip]),
                 egress_upstream_ca_file=str(world.ca_file),
                 sandbox_domain=DOMAIN, tls_listen=f"127.0.0.1:{port}",
                 tls_cert_file=str(cert), tls_key_file=str(key)) as server:
        server.tls_port = port  # type: ignore[attr-defined]
        yield server


@pytest.fixture(scope="module")
def summary(node: NodeServer, world: World, tls: tuple[Path, Path, Path]) -> dict[str, Any]:
    """One run of network_suite.mjs against the node: its JSON summary."""
    node_bin = shutil.which("node")
    assert node_bin, "node is required (make test installs it)"
    ensure_node_modules()  # a fresh checkout or a stale install: the pinned e2b
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(client_env(node))
    env.update({
        "AENV_JS_PUBLIC": json.dumps(PUBLIC),
        "AENV_JS_WORLD_CA": str(world.ca_file),
        "AENV_JS_AUTHORIZATIONS": str(world.authorizations),
        "AENV_JS_TLS_PORT": str(node.tls_port),  # type: ignore[attr-defined]
        "AENV_JS_TLS_CA": str(tls[2]),
    })
    started = time.monotonic()
    done = subprocess.run([node_bin, "network_suite.mjs"], cwd=JS_DIR, env=env,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    print(f"network_suite.mjs: exit {done.returncode} in {time.monotonic() - started:.0f} s\n"
          + done.stderr[-6000:])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (f"network_suite.mjs printed no summary (exit {done.returncode}); "
                   f"stdout={done.stdout[-2000:]!r} stderr={done.stderr[-3000:]!r}")
    result: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in result, f"network_suite.mjs crashed: {result['error']}"
    xfails = {k: v for k, v in result["cases"].items() if v.startswith(("xfail", "skip"))}
    if xfails:
        print("expected failures and skips:\n  "
              + "\n  ".join(f"{k}: {v}" for k, v in sorted(xfails.items())))
    return result


@pytest.mark.parametrize("source", FILES)
def test_ported_js_cases(summary: dict[str, Any], source: str) -> None:
    """Every case of ``<source>.test.ts`` passed (or is a listed skip / expected failure)."""
    cases = {name.split("/", 1)[1]: outcome for name, outcome in summary["cases"].items()
             if name.split("/", 1)[0] == source}
    assert cases, f"no {source} cases ran: {sorted(summary['cases'])}"
    failed = {name: outcome for name, outcome in cases.items()
              if not outcome.startswith(("pass", "skip", "xfail"))}
    others = {name: outcome for name, outcome in cases.items() if outcome != "pass"}
    if others:
        print(f"{source}: " + "; ".join(f"{k} -> {v}" for k, v in sorted(others.items())))
    if failed:
        pytest.fail(f"{len(failed)} of {len(cases)} {source}.test.ts cases failed:\n  "
                    + "\n  ".join(f"{name}: {outcome}" for name, outcome in failed.items()),
                    pytrace=False)
