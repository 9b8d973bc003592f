"""The torture's operations: each picks up what it needs, calls the node the way a user does
(the official SDK for files, commands and connect; the E2B REST routes for the rest), and
records what it saw in the world. Expected refusals (404 gone, 409 busy or wrong state, 429
full, 502 paused, 503 in doubt) are outcomes, not violations; a 5xx from the API, a file that
changed, or a kill slower than ``KILL_S`` is a violation.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import time
from collections.abc import Callable

import httpx
from e2b import Sandbox

from bench.torture.world import Known, World

#: A kill answers within this, whatever holds the sandbox (issue 21).
KILL_S = 5.0
#: API statuses that are refusals a user must expect under overlapping calls.
EXPECTED = {200, 201, 204, 404, 409, 429, 503}
ENVD_PORT = 49983


def _status(world: World, name: str, response: httpx.Response, sandbox_id: str) -> int:
    world.count(name, str(response.status_code))
    if response.status_code >= 500 and response.status_code not in (503, 504):
        world.violate(f"{name} {sandbox_id}: {response.status_code} {response.text[:200]}")
    elif response.status_code >= 400:
        body = (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else None
        )
        if not (
            isinstance(body, dict)
            and isinstance(body.get("code"), int)
            and isinstance(body.get("message"), str)
        ):
            world.violate(
                f"{name} {sandbox_id}: {response.status_code} without an E2B "
                f"error body: {response.text[:200]}"
            )
    return response.status_code


def create(world: World, api: httpx.Client, rng: random.Random, run: str) -> None:
    on_timeout = rng.choice(["pause", "kill"])
    sbx = Sandbox.create(
        timeout=rng.choice([60, 120, 300]),
        metadata={"torture": run},
        lifecycle={"on_timeout": on_timeout},
    )
    known = world.add(sbx.sandbox_id)
    known.kills_on_timeout = on_timeout == "kill"
    path, content = _new_file(rng)
    sbx.files.write(path, content)
    known.files[path] = _digest(content)
    world.count("create", "201")


def pause(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    memory = rng.random() < 0.7
    r = api.post(f"/sandboxes/{known.sandbox_id}/pause", json={"memory": memory})
    _status(world, "pause" if memory else "pause-files", r, known.sandbox_id)


def resume(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    sid = known.sandbox_id
    if rng.random() < 0.5:
        r = api.post(f"/sandboxes/{sid}/resume", json={"timeout": 120})
    else:
        r = api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 120})
    if _status(world, "resume", r, sid) in (200, 201):
        check_file(world, rng, known)


def connect(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    Sandbox.connect(known.sandbox_id, timeout=120)
    world.count("connect", "ok")
    check_file(world, rng, known)


def timeout(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    seconds = rng.choice([0, 5, 60, 120]) if rng.random() < 0.2 else rng.choice([60, 120])
    r = api.post(f"/sandboxes/{known.sandbox_id}/timeout", json={"timeout": seconds})
    _status(world, "timeout", r, known.sandbox_id)
    if r.status_code == 204 and seconds == 0:
        known.expires = True


def refresh(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    r = api.post(f"/sandboxes/{known.sandbox_id}/refreshes", json={"duration": 120})
    _status(world, "refresh", r, known.sandbox_id)


def snapshot(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    r = api.post(f"/sandboxes/{known.sandbox_id}/snapshots", json={})
    if _status(world, "snapshot", r, known.sandbox_id) == 201:
        snapshot_id = r.json()["snapshotID"]
        if rng.random() < 0.5:
            d = api.delete(f"/templates/{snapshot_id}")
            _status(world, "snapshot-delete", d, snapshot_id)
        else:
            world.snapshots.add(snapshot_id)


def fork(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    inherited = dict(known.files)  # acknowledged before the fork: every child has them
    r = api.post(
        f"/sandboxes/{known.sandbox_id}/fork", json={"count": rng.randint(1, 2), "timeout": 120}
    )
    if _status(world, "fork", r, known.sandbox_id) != 201:
        return
    for entry in r.json():
        if "sandbox" in entry:
            child = world.add(entry["sandbox"]["sandboxID"], inherited)
            child.kills_on_timeout = known.kills_on_timeout
            check_file(world, rng, child)


def kill(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    started = time.monotonic()
    try:
        r = api.delete(f"/sandboxes/{known.sandbox_id}")
    except httpx.TransportError:
        # The node died under the kill: it may have marked the sandbox killing, which its
        # recovery then finishes, or never seen the call.
        known.expires = True
        raise
    took = time.monotonic() - started
    _status(world, "kill", r, known.sandbox_id)
    # Killed only once the node said so (a kill sent to a node being restarted never ran).
    known.killed = r.status_code in (204, 404)
    with world.lock:
        world.kill_seconds.append(took)
    if took > KILL_S:
        world.violate(f"kill {known.sandbox_id} took {took:.1f} s")
    if r.status_code in (204, 404):
        after = api.get(f"/sandboxes/{known.sandbox_id}")
        if after.status_code != 404:
            world.violate(f"kill {known.sandbox_id}: still there ({after.status_code})")


def write(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    path, content = _new_file(rng)
    _handle(known).files.write(path, content)
    known.files[path] = _digest(content)
    world.count("write", "ok")


def command(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    out = _handle(known).commands.run("echo alive", timeout=30)
    if out.stdout != "alive\n":
        world.violate(f"command {known.sandbox_id}: {out.stdout!r}")
    world.count("command", "ok")


def proxy(world: World, api: httpx.Client, rng: random.Random, known: Known) -> None:
    r = api.get(
        "/health", headers={"E2b-Sandbox-Id": known.sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
    )
    world.count("proxy", str(r.status_code))
    if r.status_code >= 500 and r.status_code != 502:
        world.violate(f"proxy {known.sandbox_id}: {r.status_code} {r.text[:200]}")


def check_file(world: World, rng: random.Random, known: Known) -> None:
    """One file the sandbox was told to keep still has its content (pause/resume, fork)."""
    if not known.files:
        return
    path = rng.choice(sorted(known.files))
    try:
        content = _handle(known).files.read(path)
    except Exception as exc:  # paused again meanwhile, killed: not a drift
        world.count("check", type(exc).__name__)
        return
    if _digest(content) != known.files[path]:
        world.violate(f"checksum drift in {known.sandbox_id}:{path}")
    world.count("check", "ok")


def _handle(known: Known) -> Sandbox:
    # Through the proxy with the sandbox's own token: no connect, so a paused sandbox stays
    # paused (the call then fails with the SDK's not-running error).
    if known.handle is None:
        known.handle = Sandbox.connect(known.sandbox_id, timeout=120)
    return known.handle


def _new_file(rng: random.Random) -> tuple[str, str]:
    # A fresh path per write: a write racing a fork or pause never changes a file whose
    # content is known.
    return f"/home/user/t-{secrets.token_hex(6)}", secrets.token_hex(rng.randint(8, 4096))


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


ON_SANDBOX: dict[str, tuple[float, Callable[[World, httpx.Client, random.Random, Known], None]]] = {
    "pause": (10, pause),
    "resume": (10, resume),
    "connect": (5, connect),
    "timeout": (6, timeout),
    "refresh": (4, refresh),
    "snapshot": (4, snapshot),
    "fork": (3, fork),
    "kill": (3, kill),
    "write": (12, write),
    "command": (10, command),
    "proxy": (8, proxy),
}
