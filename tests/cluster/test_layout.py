"""Issue 13's layout: three nodes, each in a network namespace of its own with its own
address, two schedulers, two gateways (each asking its own scheduler), a real Redis and a
real S3 server (``tests/cluster/layout.py``).

- 60 creates through both gateways at once spread over the nodes by score, and no node goes
  over its limit;
- the E2B SDK pointed at a gateway passes the same core tests as against a node (they are
  ``tests/server/test_sdk_sync.py``'s, imported here and run through the gateway), and the
  JS SDK's smoke run (``tests/js/server_smoke.mjs``) passes through the other gateway.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Sandbox

from tests.cluster.layout import Layout, cluster_layout
from tests.cluster.test_gateway import node_of
from tests.js_sdk import JS_DIR, ensure_node_modules
from tests.server.harness import restore_environ

# The core SDK tests, run against a gateway (they take the ``server`` and ``sandbox``
# fixtures defined below).
from tests.server.test_sdk_sync import (  # noqa: F401
    test_background_and_exit_codes,
    test_base_template_contents,
    test_connect_extends_but_never_shortens,
    test_create_run_and_info,
    test_env_vars_from_create,
    test_files_and_pty,
    test_kill_and_not_found,
    test_kill_during_a_running_command,
    test_list_pagination_and_filters,
    test_metrics,
    test_network_options_are_kept_and_updatable,
    test_passwordless_sudo,
    test_set_timeout_expiry_stops_the_sandbox,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(900)]

#: Sandboxes per node: three nodes hold 75, the spread test asks for 60.
LIMIT = 25
CREATES = 60


@pytest.fixture(scope="module")
def layout() -> Iterator[Layout]:
    with cluster_layout(max_sandboxes=str(LIMIT), warm_pool_size="2") as lay:
        env = lay.point_sdk_at(lay.gateways[0])
        saved = {k: os.environ.get(k) for k in (*env, "E2B_DEBUG")}
        os.environ.update(env)
        os.environ.pop("E2B_DEBUG", None)
        try:
            yield lay
        finally:
            restore_environ(saved)


@pytest.fixture(scope="module")
def server(layout: Layout) -> Layout:
    """What the imported SDK tests ask for: here, the cluster behind the gateway."""
    return layout


@pytest.fixture
def sandbox(layout: Layout) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


def test_nodes_listen_on_addresses_of_their_own(layout: Layout) -> None:
    hosts = {node.host for node in layout.nodes}
    assert len(hosts) == 3 and "127.0.0.1" not in hosts
    for node, ns in zip(layout.nodes, layout.names, strict=True):
        assert node.host == ns.node_ip


def test_sixty_creates_spread_by_score_and_no_node_over_its_limit(layout: Layout) -> None:
    def create(i: int) -> Sandbox:
        gateway = layout.gateways[i % len(layout.gateways)]
        return Sandbox.create(timeout=300, api_url=gateway.url, sandbox_url=gateway.url,
                              metadata={"spread": layout.nonce})

    with ThreadPoolExecutor(6) as pool:
        made = list(pool.map(create, range(CREATES)))
    try:
        per_node = collections.Counter(
            layout.index_of(node_of(layout.redis, sbx.sandbox_id)) for sbx in made)
        print(f"60 creates: {dict(sorted(per_node.items()))}")
        assert sum(per_node.values()) == CREATES
        assert max(per_node.values()) <= LIMIT, per_node
        # By score: the load-based spread puts each node within a few of an even share.
        assert min(per_node.get(i, 0) for i in range(3)) >= CREATES // 3 - 8, per_node
        for sbx in made[:: CREATES // 6]:
            assert sbx.commands.run("echo up").stdout == "up\n"
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.kill(), made))


@pytest.mark.js
def test_js_sdk_through_the_other_gateway(layout: Layout) -> None:
    node = shutil.which("node")
    assert node, "node is required (make test installs it)"
    ensure_node_modules()
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(layout.point_sdk_at(layout.gateways[1]))
    done = subprocess.run([node, "server_smoke.mjs"], cwd=JS_DIR, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary; stdout={done.stdout!r} stderr={done.stderr[-2000:]!r}"
    summary = json.loads(lines[-1])
    assert summary["ok"], summary
    assert done.returncode == 0
