"""``aenv doctor`` reports each check, one line per runtime and platform, and its exit status
says whether the configured node can run here (no node needed: it runs against this host).

What works on this host is found by the real probes, so the tests ask that the doctor's lines be
consistent with a run of those probes and with the configuration, not that they name one answer.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from aenv.cli import doctor
from aenv.core.settings import Settings
from aenv.runtime.host_probe import GVISOR_PLATFORMS, HostCheck, probe_gvisor_platform
from tests.cli_run import AENV

#: The gVisor probes' timeout (10 s) plus the clean-up of a spinning platform, the network
#: checks and a loaded machine.
DOCTOR_TIMEOUT_S = 120
_LINE = re.compile(r"^(ok|warn|fail)\s+(.+?): (.*)$")


def run_doctor(home: Path, **env: str) -> tuple[int, list[str], dict[str, tuple[str, str]]]:
    """Exit status, stdout lines and ``{check name: (status, reason)}`` of ``aenv doctor``
    under the configuration ``env`` (nothing of this process' ``AENV_*``)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    done = subprocess.run([str(AENV), "doctor"], text=True, capture_output=True,
                          env={**clean, "AENV_HOME": str(home), "COLUMNS": "200",
                               "NO_COLOR": "1", **env},
                          timeout=DOCTOR_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    checks = {m[2]: (m[1], m[3]) for m in map(_LINE.match, lines) if m}
    return done.returncode, lines, checks


@pytest.mark.gvisor
def test_doctor_reports_each_runtime_and_platform(tmp_path: Path) -> None:
    code, lines, checks = run_doctor(tmp_path)
    report = "\n".join(lines)
    platforms = {p: f"runtime gvisor ({p})" for p in GVISOR_PLATFORMS}
    assert {"root", "runtime gvisor", *platforms.values(), "runtime fake", "cgroups", "network",
            "disk", "loop devices", "mkfs"} <= set(checks), report
    assert "kvm" not in checks  # /dev/kvm opening says nothing: the kvm platform line tells
    # This host runs a node (the test suite's): what the configured node needs passes.
    configured = str(Settings.model_fields["runsc_platform"].default)
    assert code == 0, report
    assert lines[-1] == "the node can run here", report
    assert checks[platforms[configured]][0] == "ok", report
    assert checks[platforms[configured]][1].startswith("ran a process in "), report
    assert checks["runtime gvisor"][0] == "ok" and checks["runtime fake"][0] == "ok", report
    # A failing line is a platform the node does not use, and says so.
    for name, (status, reason) in checks.items():
        if status == "fail":
            assert name in platforms.values(), report
            assert reason.endswith(f"(not used: the node runs gvisor on {configured})"), report
    # The same probes, run here, agree on every platform the doctor found working (one that
    # failed may take the whole timeout to fail again: not repeated).
    working = [p for p, name in platforms.items() if checks[name][0] == "ok"]

    async def again() -> list[HostCheck]:
        return list(await asyncio.gather(*(probe_gvisor_platform(p) for p in working)))

    assert all(check.status == "ok" for check in asyncio.run(again())), report


@pytest.mark.gvisor
def test_a_config_the_node_refuses_fails_the_doctor(tmp_path: Path) -> None:
    code, lines, checks = run_doctor(tmp_path, AENV_WORKSPACE="bogus")
    assert code == 1, lines
    assert checks["config"][0] == "fail", lines
    assert lines[-1].startswith("the node cannot run here: config"), lines


def _probes(**found: list[HostCheck]) -> Mapping[str, object]:
    async def answer(name: str) -> list[HostCheck]:
        return found[name]

    return {name: (lambda name=name: answer(name)) for name in found}


GVISOR_PTRACE_BROKEN = [
    HostCheck("ok", "runtime gvisor", "runsc version 0.0~20240729.0 (/usr/bin/runsc)"),
    HostCheck("fail", "runtime gvisor (ptrace)", "runsc exited with status 1: no ptrace",
              "ptrace"),
    HostCheck("ok", "runtime gvisor (systrap)", "ran a process in 0.4 s", "systrap"),
    HostCheck("fail", "runtime gvisor (kvm)", "did not run a process in 10 s: the kvm platform "
              "spins on this host, and was killed", "kvm"),
]
FAKE = [HostCheck("ok", "runtime fake", "in memory")]


@pytest.mark.anyio
@pytest.mark.parametrize(("runtime", "platform", "needed", "failed"), [
    # The configured platform does not run: the node cannot, and the doctor says what would.
    ("gvisor", "ptrace", {"runtime gvisor", "runtime gvisor (ptrace)"},
     {"runtime gvisor (ptrace)"}),
    # It does: the platforms the node does not use decide nothing.
    ("gvisor", "systrap", {"runtime gvisor", "runtime gvisor (systrap)"}, set()),
    # The fake needs nothing of gVisor.
    ("fake", "ptrace", {"runtime fake"}, set()),
])
async def test_only_what_the_configured_node_uses_decides(
        monkeypatch: pytest.MonkeyPatch, runtime: str, platform: str, needed: set[str],
        failed: set[str]) -> None:
    monkeypatch.setattr(doctor, "PROBES", _probes(gvisor=GVISOR_PTRACE_BROKEN, fake=FAKE))
    checks = await doctor._runtimes(runtime, platform)
    assert [c.name for c in checks] == [c.name for c in GVISOR_PTRACE_BROKEN + FAKE]
    assert {c.name for c in checks if c.needed} == needed
    assert {c.name for c in checks if c.needed and c.status == "fail"} == failed
    reasons = {c.name: c.reason for c in checks}
    uses = f"gvisor on {platform}" if runtime == "gvisor" else "fake"
    for check in checks:
        if check.status == "fail" and not check.needed:
            assert check.reason.endswith(f" (not used: the node runs {uses})"), check
    if failed:
        assert reasons["runtime gvisor (ptrace)"].endswith(
            "; systrap works here: set AENV_RUNSC_PLATFORM=systrap")
