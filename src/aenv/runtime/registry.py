"""Runtimes chosen by config: ``Settings.runtime`` names one driver here, and nothing above
``runtime/`` names a concrete driver or its files.

Each entry maps the node's settings to a driver's own typed config (SWE-ReX style: the config
picks the backend). A new runtime — Firecracker, say — is one new module implementing
``runtime.base.Runtime`` and one entry below (and its name in ``Settings.runtime``). What a
restore must match is asked of the driver (``Runtime.image_requirements``), never read from
its files.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aenv.core.errors import InvalidArgument
from aenv.core.settings import Settings
from aenv.runtime.base import Runtime
from aenv.runtime.host_probe import HostCheck, probe_fake, probe_gvisor


@dataclass(frozen=True)
class Driver:
    name: str
    #: One line for ``aenv doctor`` and the docs.
    summary: str
    build: Callable[[Settings], Runtime]
    #: Can this host run it (``aenv doctor``): one line per check, platforms included.
    probe: Callable[[], Awaitable[list[HostCheck]]]


def _gvisor(settings: Settings) -> Runtime:
    from aenv.runtime import oci
    from aenv.runtime.gvisor import GvisorConfig, GvisorRuntime

    if settings.memory_merge:
        # Before any runsc process starts: each inherits the opt-in from the node.
        from aenv.runtime.memory_merge import opt_in

        opt_in()
    disk = settings.workspace == "disk"
    return GvisorRuntime(GvisorConfig(
        state_dir=settings.home / "runtime",
        # Disk workspaces: the root's writes go through the gofer to the host overlay (whose
        # upper is the sandbox's disk image); /tmp stays in sandbox memory.
        overlay2="none" if disk else "root:memory", tmp_in_memory=disk,
        platform=settings.runsc_platform, limits=oci.Limits(pids=settings.host_tasks_limit)))


def _fake(settings: Settings) -> Runtime:
    from aenv.runtime.fake import FakeRuntime

    # A node waits for envd in every sandbox and probes it: each fake sandbox gets a guest
    # answering envd's control endpoints in its slot. Unit tests construct FakeRuntime()
    # themselves, without, since their slots have no netns.
    return FakeRuntime(guest=True)


DRIVERS: dict[str, Driver] = {
    "gvisor": Driver("gvisor", "gVisor (runsc): a user-space kernel per sandbox", _gvisor,
                     probe_gvisor),
    "fake": Driver("fake", "in memory, no processes: tests of the control plane", _fake,
                   probe_fake),
}


def build_runtime(settings: Settings) -> Runtime:
    """The driver ``settings.runtime`` names, configured from ``settings``.
    On failure: :class:`InvalidArgument` for a name no driver has."""
    driver = DRIVERS.get(settings.runtime)
    if driver is None:
        raise InvalidArgument(
            f"runtime {settings.runtime!r} is not one of {', '.join(sorted(DRIVERS))}")
    return driver.build(settings)
