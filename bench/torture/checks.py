"""The torture's invariants at the end of a run: every sandbox settles, keeps its files, dies
within the kill bound, and leaves nothing behind on the host."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from e2b import Sandbox, SandboxNotFoundException
from tests.server.harness import leaked_sandboxes

from bench.torture.actions import KILL_S, _digest
from bench.torture.world import Known, World

#: Every sandbox is running or paused, with no operation holding it, this soon after the
#: last call (a resume from disk or a spill takes 1-3 s here, under load up to ~10).
SETTLE_S = 45.0


def settled(world: World, api: httpx.Client) -> dict[str, str]:
    """Wait for every sandbox the clients did not kill to settle; its state by id."""
    states: dict[str, str] = {}
    deadline = time.monotonic() + SETTLE_S
    pending = {k.sandbox_id: k for k in world.live()}
    while pending and time.monotonic() < deadline:
        for sid, known in list(pending.items()):
            r = api.get(f"/sandboxes/{sid}")
            if r.status_code == 404:
                if not (known.expires or known.kills_on_timeout):
                    world.violate(f"sandbox {sid} is gone without a kill: {r.text[:200]}")
                known.killed = True
                del pending[sid]
                continue
            if r.status_code != 200:
                world.violate(f"info of {sid}: {r.status_code} {r.text[:200]}")
                del pending[sid]
                continue
            now = r.json().get("aenv", {})
            if now.get("state") in ("running", "paused") and not now.get("operation"):
                states[sid] = now["state"]
                del pending[sid]
        time.sleep(0.2)
    for sid in pending:
        world.violate(f"sandbox {sid} did not settle within {SETTLE_S:.0f} s")
    return states


def files_kept(world: World, api: httpx.Client, states: dict[str, str]) -> None:
    """Every file every sandbox was told it kept, byte for byte (resumed first if paused)."""
    for sid, state in states.items():
        known = world.sandboxes[sid]
        try:
            sbx = Sandbox.connect(sid, timeout=120)  # resumes a paused one
            for path, digest in known.files.items():
                if _digest(sbx.files.read(path)) != digest:
                    world.violate(f"checksum drift in {sid}:{path} (was {state})")
        except SandboxNotFoundException as exc:
            # Reading every sandbox takes minutes: one created with ``on_timeout: kill`` may
            # reach its end (60-120 s) after it settled. Gone for that reason only if the
            # node agrees it is gone and says nothing else.
            gone = api.get(f"/sandboxes/{sid}").status_code == 404
            if gone and (known.kills_on_timeout or known.expires):
                known.killed = True
                world.count("check", "expired")
            else:
                world.violate(f"files of {sid} ({state}) unreadable: {exc!r}"[:300])
        except Exception as exc:
            world.violate(f"files of {sid} ({state}) unreadable: {exc!r}"[:300])


def kill_all(world: World, api: httpx.Client) -> None:
    for known in list(world.sandboxes.values()):
        # Every one, the killed ones too: a kill answered 204 must find it gone (404).
        started = time.monotonic()
        r = api.delete(f"/sandboxes/{known.sandbox_id}")
        if known.killed and r.status_code != 404:
            world.violate(
                f"{known.sandbox_id} was killed, but a second kill answered {r.status_code}"
            )
        known.killed = True
        took = time.monotonic() - started
        world.kill_seconds.append(took)
        if r.status_code not in (204, 404) or took > KILL_S:
            world.violate(f"final kill of {known.sandbox_id}: {r.status_code} in {took:.1f} s")
    for snapshot_id in sorted(world.snapshots):
        r = api.delete(f"/templates/{snapshot_id}")
        if r.status_code not in (204, 404):
            world.violate(f"delete of snapshot {snapshot_id}: {r.status_code}")


def leaks(world: World, home: Path, slot_range: tuple[int, int], slots_before: int,
          pools: Callable[[], int]) -> None:
    """Nothing of any sandbox the run made is left: runsc processes, cgroups, rootfs and
    runtime directories, memory images, mounts, loop devices, paused manifests, staging; and
    the network slots are back to what the pools held before the run, or hold now
    (``pools``: the node's own count; the pre-created pool fills for the shape the run's
    restores asked for, after the baseline was taken)."""
    ids = set(world.sandboxes)
    deadline = time.monotonic() + 30
    found: list[str] = []
    while time.monotonic() < deadline:
        found = _leftovers(ids, home) + _slots(slot_range, max(slots_before, pools()))
        if not found:
            return
        time.sleep(1)
    for what in found:
        world.violate(f"leak: {what}")


def _leftovers(ids: set[str], home: Path) -> list[str]:
    found: list[str] = []
    for pid in leaked_sandboxes(home):  # the node's runsc processes: its pools' too
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(i in argv for i in ids):
            found.append(f"process {pid}: {argv[:120]}")
    for root in Path("/sys/fs/cgroup").iterdir():
        parent = root / "aenv"
        if parent.is_dir():
            found += [f"cgroup {d}" for d in parent.iterdir() if d.name in ids]
    for sub in ("sandboxes", "runtime", "paused"):
        directory = home / sub
        if directory.is_dir():
            found += [
                f"{sub}/{d.name}"
                for d in directory.iterdir()
                if d.name.removesuffix(".partial") in ids
            ]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line.split()[4]}" for line in mounts.splitlines() if any(i in line for i in ids)
    ]
    loops = subprocess.run(["losetup", "-J", "-l"], capture_output=True, text=True).stdout
    for device in json.loads(loops or '{"loopdevices": []}').get("loopdevices", []):
        backing = device.get("back-file") or ""
        if any(i in backing for i in ids):
            found.append(f"loop device {device['name']} on {backing}")
    manifests = home / "repository" / "manifests"
    if manifests.is_dir():
        found += [
            f"manifest {m.name}"
            for m in manifests.iterdir()
            if m.name.removeprefix("paused-").split(".")[0] in ids
        ]
    staging = home / "staging"
    if staging.is_dir():
        found += [f"staging/{s.name}" for s in staging.iterdir()]
    return found


def unreferenced_blobs(home: Path, older_than_s: float) -> list[str]:
    """Repository blobs no manifest names that a GC pass should have taken (older than its
    grace): what the run's pauses, snapshots and forks left behind."""
    repository = home / "repository"
    named: set[str] = set()
    for manifest in (repository / "manifests").glob("*"):
        with contextlib.suppress(OSError):
            named |= set(re.findall(r"sha256:([0-9a-f]{64})", manifest.read_text()))
    blobs = repository / "blobs" / "sha256"
    found = []
    now = time.time()
    for blob in blobs.iterdir() if blobs.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            st = blob.stat()
            if blob.name not in named and now - st.st_mtime > older_than_s:
                # The whole name (a temporary one shows its suffix), age and links: enough
                # to tell a failed commit's blob from a writer's leftover.
                found.append(f"blob {blob.name} ({st.st_size >> 20} MiB, "
                             f"{now - st.st_mtime:.0f} s old, {st.st_nlink} links)")
    return found


def slot_indices(slot_range: tuple[int, int]) -> list[int]:
    """The indices of the network slots (``aenv-<index>`` netns) in ``slot_range``."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    first, last = slot_range
    found = []
    for line in names.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("aenv-") and name[5:].isdigit() and first <= int(name[5:]) <= last:
            found.append(int(name[5:]))
    return sorted(found)


def slots_in_use(slot_range: tuple[int, int]) -> int:
    return len(slot_indices(slot_range))


def _slots(slot_range: tuple[int, int], held: int) -> list[str]:
    now = slot_indices(slot_range)
    if len(now) <= held:
        return []
    # Which ones the pools hold the node does not say: every index, for the node's log.
    return [f"{len(now) - held} network slots more than the pools hold "
            f"(slots on the machine: {' '.join(f'slot {i}' for i in now)})"]


def pools_of(api: httpx.Client) -> int:
    """The network slots the node's pools hold now (``GET /node/pools``): ready slots, warm
    and pre-created sandboxes, those being made for them, paused ones ready to resume."""
    held = api.get("/node/pools").json()
    return sum(int(held[k]) for k in ("networkSlots", "warm", "precreated", "making",
                                      "resumeReady"))


def report(world: World) -> str:
    kills = sorted(world.kill_seconds)
    p = (lambda q: kills[min(len(kills) - 1, int(q * len(kills)))]) if kills else (lambda q: 0.0)
    lines = [
        f"sandboxes {len(world.sandboxes)}, calls {sum(world.outcomes.values())}, "
        f"kills {len(kills)} (p50 {p(0.5):.2f} s, max {max(kills, default=0):.2f} s), "
        f"violations {len(world.violations)}"
    ]
    by_op: dict[str, list[str]] = {}
    for (op, outcome), n in sorted(world.outcomes.items()):
        by_op.setdefault(op, []).append(f"{outcome} x{n}")
    lines += [f"  {op}: {', '.join(v)}" for op, v in by_op.items()]
    lines += [f"  VIOLATION {v}" for v in world.violations[:50]]
    return "\n".join(lines)


__all__ = [
    "Known",
    "files_kept",
    "kill_all",
    "leaks",
    "pools_of",
    "report",
    "settled",
    "slot_indices",
    "slots_in_use",
    "unreferenced_blobs",
]
