"""The envd process under bubblewrap, and its memory as the host sees it."""

from __future__ import annotations

import os
from pathlib import Path

from bench.envd_bench.common import Memory


def _ppid_and_comm(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is parenthesised and may contain spaces: split around the last ')'.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return int(stat[stat.rindex(")") + 2 :].split()[1]), comm


def find_envd_pid(bwrap_pid: int) -> int:
    """envd inside the sandbox: the first non-bwrap descendant of the bwrap we started.

    bwrap with ``--unshare-pid`` forks a second bwrap that is pid 1 of the namespace; that one
    runs envd (the bundle's launcher execs the interpreter, so it keeps the pid). Processes
    envd spawns are deeper still, so breadth-first order finds envd first.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _ppid_and_comm(int(entry.name))) is not None:
            children.setdefault(info[0], []).append((int(entry.name), info[1]))
    queue = [bwrap_pid]
    while queue:
        for pid, comm in sorted(children.get(queue.pop(0), [])):
            if comm != "bwrap":
                return pid
            queue.append(pid)
    raise RuntimeError(f"no envd process under bwrap pid {bwrap_pid}")


def exec_helper_of(pid: int, bundle: Path | None) -> str | None:
    """The exec-as helper envd spawns user processes through, if any.

    With it, CPython's Popen can vfork (the helper switches user); without it, every command
    run as a non-root user costs a full fork of envd -- the biggest item in the round trip.
    """
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if b"--exec-helper" in argv:
        return argv[argv.index(b"--exec-helper") + 1].decode()
    if bundle is not None and os.access(bundle / "bin" / "exec-as", os.X_OK):
        return str(bundle / "bin" / "exec-as")  # envd's default when run from a bundle
    return None


def _kib_fields(path: Path, names: set[str]) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            values[key] = int(rest.split()[0])
    return values


def read_memory(pid: int, when: str) -> Memory:
    status = _kib_fields(Path(f"/proc/{pid}/status"), {"VmRSS", "VmHWM"})
    try:
        rollup = _kib_fields(Path(f"/proc/{pid}/smaps_rollup"), {"Pss", "Pss_Anon"})
    except OSError:  # kernels before 4.14 have no smaps_rollup
        rollup = {}

    def mib(kib: int | None) -> float | None:
        return None if kib is None else round(kib / 1024, 1)

    return Memory(
        when,
        pid,
        mib(status["VmRSS"]) or 0.0,
        mib(rollup.get("Pss")),
        mib(rollup.get("Pss_Anon")),
        mib(status["VmHWM"]) or 0.0,
    )
