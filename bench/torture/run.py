"""The torture's clients and chaos: ``clients`` threads call random operations on random
sandboxes (keeping about ``sandboxes`` of them), a chaos thread kills the node with SIGKILL
at random moments and starts it again on the same home, then the invariants are checked."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from bench.torture import actions, checks
from bench.torture.world import World


class CrashableNode(Protocol):
    """A node that can be killed with SIGKILL and started again on its home (the test
    harness's ``CrashableNode``)."""

    home: Path
    slots: dict[str, str]

    @property
    def url(self) -> str: ...

    def kill9(self) -> None: ...

    def restart(self) -> None: ...


@dataclass(frozen=True)
class Plan:
    seconds: float
    sandboxes: int
    clients: int
    #: How many times the node is killed with SIGKILL (at random moments of the run).
    crashes: int
    seed: int = 21


def run(node: CrashableNode, api_key: str, plan: Plan) -> World:
    world = World()
    rng = random.Random(plan.seed)
    run_id = f"torture-{plan.seed}"
    slot_range = (int(node.slots["net_first_index"]), int(node.slots["net_last_index"]))
    time.sleep(2)  # the pools fill after start: the baseline is what they hold at rest
    slots_before = checks.slots_in_use(slot_range)
    stop = time.monotonic() + plan.seconds
    threads = [
        threading.Thread(
            target=_client,
            name=f"client-{i}",
            args=(node, api_key, world, random.Random(rng.random()), plan, stop, run_id),
        )
        for i in range(plan.clients)
    ]
    chaos = threading.Thread(target=_chaos, args=(node, world, rng, plan, stop), name="chaos")
    for t in (*threads, chaos):
        t.start()
    for t in (*threads, chaos):
        t.join()
    with _client_api(node, api_key) as api:
        states = checks.settled(world, api)
        checks.files_kept(world, api, states)
        checks.kill_all(world, api)
        checks.leaks(world, node.home, slot_range, slots_before,
                     lambda: checks.pools_of(api))
    return world


def _client_api(node: CrashableNode, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": api_key}, timeout=90)


def _client(
    node: CrashableNode,
    api_key: str,
    world: World,
    rng: random.Random,
    plan: Plan,
    stop: float,
    run_id: str,
) -> None:
    names = list(actions.ON_SANDBOX)
    weights = [actions.ON_SANDBOX[n][0] for n in names]
    with _client_api(node, api_key) as api:
        while time.monotonic() < stop:
            live = world.live()
            try:
                if len(live) < plan.sandboxes and rng.random() < 0.5:
                    actions.create(world, api, rng, run_id)
                    continue
                if not live:
                    time.sleep(0.2)
                    continue
                known = rng.choice(live)
                name = rng.choices(names, weights)[0]
                actions.ON_SANDBOX[name][1](world, api, rng, known)
            except Exception as exc:  # the SDK's refusals and a node that is down
                _unexpected(world, exc)
            time.sleep(rng.random() * 0.05)


def _unexpected(world: World, exc: Exception) -> None:
    text = str(exc)
    name = type(exc).__name__
    world.count("sdk", name)
    if world.node_down.is_set() or isinstance(exc, httpx.TransportError):
        return
    if " 500" in text or "Internal Server Error" in text:
        world.violate(f"{name}: {text[:200]}")


def _chaos(node: CrashableNode, world: World, rng: random.Random, plan: Plan, stop: float) -> None:
    start = time.monotonic()
    moments = sorted(start + rng.uniform(0.2, 0.8) * plan.seconds for _ in range(plan.crashes))
    for moment in moments:
        while time.monotonic() < moment:
            time.sleep(0.1)
        world.node_down.set()
        node.kill9()
        time.sleep(rng.uniform(0.5, 2.0))
        node.restart()
        world.count("chaos", "restart")
        time.sleep(1.0)  # calls that failed against the dead node have come back
        world.node_down.clear()
    while time.monotonic() < stop:
        time.sleep(0.2)
