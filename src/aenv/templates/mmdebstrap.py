"""Running mmdebstrap for a template build, and reading its progress from its log.

``run_following`` runs it through :func:`aenv.core.proc.run` while a task follows its
``--logfile``; :class:`MmdebstrapProgress` turns the verbose log's phases and apt/dpkg lines into
``(message, fraction)`` reports, a rough bar whose phase widths come from measured cold builds.
What to build (the recipe, the customization script) is :mod:`aenv.templates.base`'s. Owns no
path: the log file and the target directory are the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, FailedPrecondition


async def mmdebstrap_version() -> str:
    """``mmdebstrap --version`` (part of a recipe); :class:`FailedPrecondition` if it is
    missing or does not run."""
    if shutil.which("mmdebstrap") is None:
        raise FailedPrecondition("mmdebstrap is not installed (apt-get install mmdebstrap)")
    try:
        done = await proc.run(["mmdebstrap", "--version"], timeout=30.0)
    except CommandError as exc:
        raise FailedPrecondition(f"mmdebstrap does not run: {exc.message}") from exc
    return done.text.strip()


async def run_following(
    argv: list[str], log: Path, progress: MmdebstrapProgress, timeout: float
) -> None:
    """Run mmdebstrap while feeding each new line of its log file to ``progress``.

    ``proc.run`` captures output only at the end; mmdebstrap's ``--logfile`` lets us follow
    it live instead, from a task that polls the file.
    """
    stop = asyncio.Event()
    follower = asyncio.create_task(_follow(log, stop, progress))
    try:
        await proc.run(argv, timeout=timeout)
    except CommandError as exc:
        stop.set()
        await follower
        # With --logfile mmdebstrap's stderr is empty; the reason is at the end of the log.
        detail = f"{exc.stderr.strip()}\n--- end of mmdebstrap's log ---\n{_tail(log)}"
        raise type(exc)(exc.argv, exc.returncode, detail) from exc
    except BaseException:
        follower.cancel()
        raise
    stop.set()
    await follower


async def _follow(path: Path, stop: asyncio.Event, progress: MmdebstrapProgress) -> None:
    while not path.exists():  # mmdebstrap creates the log only once it has parsed its options
        if stop.is_set():
            return
        await _wait(stop, 0.25)
    with open(path, "rb") as handle:
        pending = b""
        while True:
            stopping = stop.is_set()  # read once more after the writer is done
            pending += handle.read()
            # apt draws progress with carriage returns; each redraw counts as a line.
            *lines, pending = re.split(rb"[\r\n]", pending)
            for raw in lines:
                if raw.strip():
                    progress.feed(raw.decode("utf-8", "replace"))
            if stopping:
                if pending.strip():
                    progress.feed(pending.decode("utf-8", "replace"))
                return
            progress.tick()
            await _wait(stop, 0.25)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


def _tail(log: Path, limit: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


@dataclass(frozen=True)
class _Phase:
    #: Start of mmdebstrap's "I: ..." line that opens the phase.
    marker: str
    start: float
    end: float
    #: What to count inside the phase, with each kind's share of the phase: apt downloads
    #: ("Get:"), dpkg unpacks and configures. Phases without counts creep forward on a timer.
    counts: tuple[tuple[str, float], ...] = ()
    #: Typical duration of a phase without counts, for the timer (seconds).
    expected_s: float = 5.0


#: Where each of mmdebstrap's phases sits on the bar; widths follow measured durations of a
#: cold build (~70 s: extracting the essential set ~30%, configuring the rest ~40%).
_PHASES: tuple[_Phase, ...] = (
    _Phase("running apt-get update", 0.01, 0.03, expected_s=3.0),
    _Phase("downloading packages", 0.03, 0.10, (("Get:", 1.0),)),
    _Phase("extracting archives", 0.10, 0.40, expected_s=20.0),
    _Phase(
        "installing essential packages", 0.40, 0.57, (("Unpacking ", 0.6), ("Setting up ", 0.4))
    ),
    _Phase(
        "installing remaining packages",
        0.57,
        0.96,
        (("Get:", 0.1), ("Unpacking ", 0.3), ("Setting up ", 0.6)),
    ),
    _Phase("running --customize-hook", 0.96, 0.97, expected_s=1.0),
    _Phase("cleaning package lists", 0.97, 0.98, expected_s=1.0),
    _Phase("success", 0.98, 0.98),
)

_NEWLY_INSTALLED = re.compile(r"(\d+) newly installed")
#: Timer-driven progress is reported in steps of at least this much, to keep events few.
_TICK_STEP = 0.005


class MmdebstrapProgress:
    """Turns mmdebstrap's verbose log into progress messages and a rough fraction."""

    def __init__(
        self,
        report: Callable[[str, float | None], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report = report
        self._clock = clock
        self._phase: _Phase | None = None
        self._message = ""
        self._entered = 0.0
        self._last = 0.0  # last fraction reported
        self._total = 0  # packages apt announced for the current phase
        self._essential = 0  # packages of the essential set (installed in a later phase)
        self._done: dict[str, int] = {}

    def feed(self, line: str) -> None:
        """Take one line of the log."""
        line = line.rstrip()
        if line.startswith(("I: ", "W: ", "E: ")):
            text = line[3:]
            for phase in _PHASES:
                if text.startswith(phase.marker):
                    self._enter(phase, text)
                    self._emit(text, phase.start)
                    return
            self._report(text, None)
            return
        current = self._phase
        if current is None or not current.counts:
            return
        match = _NEWLY_INSTALLED.search(line)
        if match:
            self._total = int(match.group(1))
            if current.marker == "downloading packages":
                self._essential = self._total
            return
        for kind, _ in current.counts:
            if line.startswith(kind) and self._total:
                self._done[kind] = self._done.get(kind, 0) + 1
                self._emit(self._describe(kind, line), self._fraction(current))
                return

    def tick(self) -> None:
        """Called a few times a second: moves the bar through phases that print nothing.

        The fraction approaches the phase's end asymptotically (1 - e^(-t/expected)), so a
        slow phase keeps visibly moving yet never claims to be done.
        """
        phase = self._phase
        if phase is None or phase.counts or phase.end <= phase.start:
            return
        elapsed = self._clock() - self._entered
        share = 1.0 - math.exp(-elapsed / phase.expected_s)
        fraction = phase.start + (phase.end - phase.start) * share
        if fraction - self._last >= _TICK_STEP:
            self._emit(self._message, fraction)

    def _enter(self, phase: _Phase, text: str) -> None:
        self._phase = phase
        self._message = text
        self._entered = self._clock()
        self._done = {}
        # The essential set is downloaded in one phase and installed in the next, which
        # prints no "newly installed" line of its own.
        self._total = self._essential if phase.marker.startswith("installing essential") else 0

    def _emit(self, message: str, fraction: float) -> None:
        self._last = max(self._last, fraction)
        self._report(message, fraction)

    def _fraction(self, phase: _Phase) -> float:
        width = phase.end - phase.start
        fraction = phase.start
        for kind, share in phase.counts:
            done = min(self._done.get(kind, 0), self._total)
            fraction += width * share * done / self._total
        return fraction

    def _describe(self, kind: str, line: str) -> str:
        count = f"{self._done[kind]}/{self._total}"
        parts = line.split()
        if kind == "Get:":
            # Get:<n> <uri> <suite/component> <arch> <package> <arch> <version> [<size>]
            return f"downloading {parts[4] if len(parts) > 4 else ''} ({count})"
        # Unpacking <package> (<version>) ...  /  Setting up <package> (<version>) ...
        verb, name = ("unpacking", parts[1]) if kind == "Unpacking " else ("setting up", parts[2])
        return f"{verb} {name.split(':')[0]} ({count})"
