"""``make test``: the suite as a few pytest processes side by side, then one summary.

The suite mostly waits (sandboxes starting, kills the host reaps slowly, crash-and-restart
cycles): one process keeps this 2-core machine ~20 % busy and takes ~40 min. Here it runs as
``--shards`` pytest processes at once (default 3; four were slower here: the suite is
CPU-bound at three, 1,851 s against 1,737 s), each on a share of the test files:

- **Prepare first**, in this process: the envd bundle and one node start and stop, so the base
  template's layers (``AENV_LAYERS_DIR``) and memory image (the harness' seed) exist before
  any shard needs them — no two shards build them at once, and no test finds them missing.
- **Alone first**: :data:`ALONE` runs before the shards, in one pytest process with nothing
  beside it: ``tests/network`` and ``tests/runtime`` use fixed host resources (slot indices
  from 61,000, one cgroup parent, one "internet" peer whose private address has a single host
  route); ``test_pool_trim.py`` times the kernel's freeing of a deleted loop-backed image,
  which a shard's crash and torture tests beside or before it delay past any bound (seen:
  over 30 s, right after the torture test in the same process).
- **Units, not tests**: a shard runs whole files, so a module's session node starts once per
  shard.
- **Balanced by measured time**: files go longest first to the least-loaded shard, by the
  seconds in ``tests/durations.json`` (a file not in it counts :data:`UNKNOWN_S`). Every run
  writes what it measured to ``build/test-durations.json``; copy it over the committed one
  when the suite's shape changes.
- **Disjoint resources**: each shard's node servers take their own block of network slots
  (``AENV_TEST_SLOT_BASE``); caches shared between shards are filled atomically (a build
  into a private name, then a rename).

Each shard's output goes to ``build/test-logs/shard-K.log`` (the alone run's to ``alone.log``)
and is printed whole when it ends; the exit status is the first failing one's. With paths or
``-k``/``-m`` in the arguments the suite runs as one plain pytest process, as ``pytest ARGS``
would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DURATIONS = TESTS / "durations.json"
MEASURED = REPO / "build" / "test-durations.json"
LOGS = REPO / "build" / "test-logs"
#: Run before the shards, alone (see the module docstring): directories and files.
ALONE = ("tests/network", "tests/runtime", "tests/storage/test_pool_trim.py")
#: The seconds a test file with no recorded duration is assumed to take.
UNKNOWN_S = 20.0
#: Slot blocks of 10,000 from here, one per shard (tests/server/harness.py); up to four end
#: at 60,000, below tests/network's 61,000.
SLOT_BASE = 20_000


@dataclass
class Shard:
    index: int
    paths: list[str] = field(default_factory=list)
    expected_s: float = 0.0
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"shard-{self.index}"

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name}.log"

    @property
    def measured(self) -> Path:
        return LOGS / f"{self.name}.durations.json"


def _alone(relative: str) -> bool:
    return any(relative == a or relative.startswith(a + "/") for a in ALONE)


def test_files() -> list[str]:
    """Every test file of the shards (repository-relative), without those of :data:`ALONE`."""
    return [relative for path in sorted(TESTS.rglob("test_*.py"))
            if not _alone(relative := path.relative_to(REPO).as_posix())]


def plan(files: list[str], recorded: dict[str, float], shards: int) -> list[Shard]:
    """Longest file first onto the shard expected to end first (LPT scheduling)."""
    seconds = {f: recorded.get(f, UNKNOWN_S) for f in files}
    planned = [Shard(i) for i in range(shards)]
    for name in sorted(seconds, key=lambda n: (-seconds[n], n)):
        shard = min(planned, key=lambda s: (s.expected_s, s.index))
        shard.paths.append(name)
        shard.expected_s += seconds[name]
    return [s for s in planned if s.paths]


def prepare() -> None:
    """What every shard shares and would otherwise build at once: the envd bundle, the base
    template's layers and its memory image."""
    aenv = REPO / ".venv" / "bin" / "aenv"
    subprocess.run([str(aenv), "envd", "bundle", "--out", str(REPO / "build" / "envd-bundle")],
                   check=True, timeout=1800)
    if os.geteuid() != 0:
        return  # no node can start; the gVisor tests skip themselves
    from tests.server.harness import prepare_shared_caches

    prepare_shared_caches()


def start(shard: Shard, paths: list[str], pytest_args: list[str]) -> None:
    env = {**os.environ,
           "AENV_TEST_SLOT_BASE": str(SLOT_BASE + shard.index * 10_000),
           "AENV_TEST_DURATIONS_OUT": str(shard.measured)}
    with open(shard.log, "wb") as log:
        shard.process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args, *paths],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    shard.started = time.monotonic()


def wait_all(shards: list[Shard]) -> list[Shard]:
    """Wait for every shard, printing each one's whole log as it ends; in order of ending."""
    running = list(shards)
    ended: list[Shard] = []
    while running:
        for shard in list(running):
            assert shard.process is not None
            if shard.process.poll() is None:
                continue
            shard.ended = time.monotonic()
            running.remove(shard)
            ended.append(shard)
            print(f"\n{'=' * 30} {shard.name} (rc {shard.process.returncode}, "
                  f"{shard.ended - shard.started:.0f} s) {'=' * 30}", flush=True)
            sys.stdout.write(shard.log.read_text(errors="replace"))
            sys.stdout.flush()
        time.sleep(1)
    return ended


def merge_durations(shards: list[Shard]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for shard in shards:
        if shard.measured.exists():
            merged.update(json.loads(shard.measured.read_text()))
    return dict(sorted(merged.items()))


def _sharded(args: list[str]) -> bool:
    """Whether ``args`` leave the whole suite to run (no paths, no selection)."""
    selecting = ("-k", "-m", "--lf", "--last-failed", "--deselect")
    return not any(a.startswith(selecting) or Path(a.split("::")[0]).exists() for a in args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=int(os.environ.get("TEST_SHARDS", "3")))
    known, pytest_args = parser.parse_known_args()
    if known.shards <= 1 or not _sharded(pytest_args):
        return subprocess.call([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO)

    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    shards = plan(test_files(), recorded, known.shards)
    LOGS.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    prepare()
    print(f"prepared in {time.monotonic() - began:.0f} s; {len(shards)} shards:", flush=True)
    # Block 0's slots: the alone run ends before shard 0 starts on them.
    alone = Shard(0, paths=list(ALONE), name="alone")
    print(f"  alone first: {', '.join(ALONE)}", flush=True)
    for shard in shards:
        print(f"  shard {shard.index}: ~{shard.expected_s:.0f} s, {', '.join(shard.paths)}",
              flush=True)
    start(alone, list(ALONE), pytest_args)
    ended = wait_all([alone])
    for shard in shards:
        start(shard, shard.paths, pytest_args)
    ended += wait_all(shards)

    measured = merge_durations(ended)
    MEASURED.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"\n{'=' * 30} summary ({time.monotonic() - began:.0f} s) {'=' * 30}")
    for shard in ended:
        assert shard.process is not None
        tail = shard.log.read_text(errors="replace").rstrip().splitlines()[-1:]
        print(f"{shard.name}: rc {shard.process.returncode}, "
              f"{shard.ended - shard.started:.0f} s (expected ~{shard.expected_s:.0f}): "
              f"{tail[0].strip('= ') if tail else 'no output'}")
    return next((s.process.returncode for s in ended
                 if s.process is not None and s.process.returncode != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
