"""Warm sandboxes are primed ahead (``orchestrator/warm.py``): a plain create skips its envd
``/init``, a create that asks for more (env vars) still gets it, and every sandbox keeps a
token and a boot id of its own."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

_READY = re.compile(r"warm sandbox (\w+) ready")
_CREATED = re.compile(r"created (\w+) \(warm\) in \d+ ms: (\w+)")


def _wait_ready(node: NodeServer, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_READY.findall(node.log())) < count:
        assert time.monotonic() < deadline, "the warm pool did not fill"
        time.sleep(0.2)


def _step(node: NodeServer, sandbox_id: str) -> str:
    return {sid: step for sid, step in _CREATED.findall(node.log())}.get(sandbox_id, "?")


def test_a_plain_create_skips_init_and_one_with_env_vars_does_not() -> None:
    with serving(warm_pool_size="3") as node:
        _wait_ready(node, 3)
        plain = Sandbox.create(timeout=120)
        other = Sandbox.create(timeout=120)
        with_env = Sandbox.create(envs={"AENV_PRIMED_TEST": "yes"}, timeout=120)
        assert _step(node, plain.sandbox_id) == "primed"
        assert _step(node, other.sandbox_id) == "primed"
        assert _step(node, with_env.sandbox_id) == "init"

        assert with_env.commands.run("echo $AENV_PRIMED_TEST").stdout.strip() == "yes"
        assert plain.commands.run("echo -n $AENV_PRIMED_TEST").stdout == ""
        assert plain.commands.run("whoami").stdout.strip() == "user"
        boot_ids = {s.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
                    for s in (plain, other, with_env)}
        assert len(boot_ids) == 3  # each primed (or initialised) with a boot id of its own

        # Each token opens its own sandbox's envd only.
        for sbx, stranger in ((plain, other), (other, plain)):
            token = sbx._envd_access_token
            assert token and token != stranger._envd_access_token
            assert _read_hostname(node, sbx, token) == 200
            assert _read_hostname(node, stranger, token) == 401
        for sbx in (plain, other, with_env):
            sbx.kill()


def _read_hostname(node: NodeServer, sbx: Sandbox, token: str) -> int:
    return httpx.get(f"{node.url}/files", params={"path": "/etc/hostname"},
                     headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
                              "X-Access-Token": token}, timeout=30).status_code


def test_a_warm_sandbox_ran_a_first_command_ahead_and_shows_nothing_of_it() -> None:
    """Priming runs one ``bash -l -c true`` in each warm sandbox, so the user's first command
    finds bash's and envd's pages mapped in; it has ended by the claim. Its trace: the warm
    sandbox's next pid is past a cold one's (both restore the same image)."""
    with serving(warm_pool_size="1") as node:
        _wait_ready(node, 1)
        warm = Sandbox.create(timeout=120)
        cold = Sandbox.create(timeout=120)  # the pool is empty until its refill's restore
        try:
            assert _step(node, warm.sandbox_id) == "primed"
            assert re.search(rf"created {cold.sandbox_id} \(cold\)", node.log()), \
                "the second create should have restored afresh"
            assert warm.commands.list() == []
            assert int(warm.commands.run("echo $$").stdout) > \
                int(cold.commands.run("echo $$").stdout)
        finally:
            warm.kill()
            cold.kill()
