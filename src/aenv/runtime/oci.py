"""OCI runtime bundles for gVisor sandboxes: ``config.json`` and the small files it mounts.

Pure where it matters: ``sandbox_config`` builds the config from a ``SandboxSpec`` and returns a
dict (unit-testable without runsc); ``write_bundle`` puts it and the per-sandbox ``/etc`` files
on disk.

What runsc 20240729 does with the config (checked on this cgroup-v1 host):

* ``linux.cgroupsPath`` + ``linux.resources`` are applied to the sandbox and gofer processes on
  the host (memory, cpu, pids controllers), so the *whole* sandbox — sentry, gofer and every
  guest process — is bounded. runsc also passes the memory limit to the sentry as its total
  memory: the guest's ``/proc/meminfo`` shows ``MemTotal`` = the limit.
* A guest memory hog meets the host's memcg OOM killer. Often it picks the systrap stub process
  of the hog's address space: the hog dies, the sandbox lives on. But the hog's pages live in
  the sentry's memory file and are freed only once the sentry notices the death, so a second
  OOM right after can take the sentry itself (seen about half the time on 2026-12-01 here, as
  often at older commits): the sandbox dies, its neighbours never notice. Giving the sentry a
  lower ``oom_score_adj`` does not help (stubs are forked from it and inherit it).
* The pids limit counts host tasks: sentry threads and the platform's stub processes and
  threads, which grow with the guest's churn of address spaces, not with its live processes
  (measured 2026-12-03 during a bash fork bomb: ptrace ~10-15 host tasks per guest process,
  kept after the guest's exit for reuse; systrap several stub processes per guest process).
  Reaching it makes the sentry panic (exit status 2): the sandbox dies, its neighbours do not
  notice. Neither the guest's ``RLIMIT_NPROC`` (non-root only) nor a pids cgroup inside the
  guest keeps a bomb below it, and envd killing what reaches such a cgroup's limit saved the
  sandbox only about half the time (``Limits.guest_pids``, off by default).

Owns: the bundle directory's contents. Must not touch: the rootfs or the envd bundle (both
mounted, never written by us).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.core.errors import InvalidArgument
from aenv.core.net import NetSlot
from aenv.envd import volume_binds
from aenv.runtime.base import ENVD_MOUNT, ENVD_PORT, SandboxSpec

#: Where the bundle's sudo stand-in is mounted in every sandbox.
SUDO_PATH = "/usr/local/bin/sudo"

#: CFS period; the quota is ``cpu_count`` periods.
CPU_PERIOD_US = 100_000
#: Annotation naming the sandbox (the bundle path says it too; this survives moves).
SANDBOX_ID_ANNOTATION = "dev.aenv.sandbox-id"
#: runsc names a container's host FDs in a checkpoint after this annotation; without it the
#: name is "" at checkpoint and "__no_name_0" at restore, and no restore finds its FDs.
CONTAINER_NAME_ANNOTATION = "io.kubernetes.cri.container-name"
CONTAINER_NAME = "envd"

#: Docker's default set, plus what E2B users expect root to be able to do inside a sandbox
#: (mount, ptrace a debugger, raise limits, renice) — all of it virtual: these act on gVisor's
#: kernel, not the host's. CAP_NET_RAW is added only with runsc's ``--net-raw``.
CAPABILITIES = (
    "CAP_AUDIT_WRITE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_IPC_LOCK",
    "CAP_KILL",
    "CAP_MKNOD",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_ADMIN",
    "CAP_SYS_CHROOT",
    "CAP_SYS_NICE",
    "CAP_SYS_PTRACE",
    "CAP_SYS_RESOURCE",
)

DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}


@dataclass(frozen=True)
class Limits:
    """Per-sandbox limits that are node policy rather than part of a create request."""

    #: Host tasks of the whole sandbox (cgroup pids.max; the node passes its
    #: ``host_tasks_limit``, 8,192); a backstop for the host: reaching it makes the sentry
    #: panic and the sandbox die (the death says so: runtime/exits.py). The node's task guard
    #: stops a runaway guest well before.
    pids: int = 2048
    #: Guest processes per non-root user (RLIMIT_NPROC); root is not bound by it.
    nproc: int = 512
    #: Open files per process (RLIMIT_NOFILE), as containerd sets it.
    nofile: int = 1_048_576
    #: Tasks of the user's processes in the sandbox's own pids cgroup, at which envd kills
    #: them all as a fork bomb (``envd/pidlimit.py``); 0: off, the default. Measured on the
    #: ptrace platform (2026-12-03, a loaded 2-core host): a bash fork bomb reaches ~12-15
    #: host tasks per guest process (runsc's traced stub threads: one per address space and
    #: sentry thread), growing by ~500/s more while envd kills it (0.7-5 s: the bomb starves
    #: envd), so only a limit near ``pids // 64`` leaves envd time, and even then about half
    #: of the bombs still ended the sandbox; a higher limit lets more runnable bomb tasks
    #: starve envd (at 1,024 it never got to run). Too low for many workloads (a JVM's
    #: threads) for too little: off. On systrap the same killer at 256 saved all 4 bombs
    #: tried (host peak ~900 tasks): worth turning on for that platform.
    guest_pids: int = 0


def envd_argv(spec: SandboxSpec, limits: Limits | None = None) -> list[str]:
    """envd's command line inside the sandbox."""
    return [
        f"{ENVD_MOUNT}/bin/envd",
        "--port",
        str(ENVD_PORT),
        "--host",
        "0.0.0.0",
        # This runsc keeps every dead task that read /proc/self in procfs's lookup cache,
        # so each later checkpoint grows ~116 KB per such program (ps, node, busybox...).
        "--remount-proc",
        # Each sandbox its own /proc/sys/kernel/random/boot_id (a template's sandboxes are
        # restores of one image, which holds the kernel's id); envd/bootid.py.
        "--own-boot-id",
        # User processes in a pids cgroup of their own, below the host's limit (if on).
        *(["--pids-limit", str(limits.guest_pids)] if limits and limits.guest_pids else []),
        *spec.envd_args,
    ]


def sandbox_config(
    spec: SandboxSpec,
    net: NetSlot,
    *,
    cgroups_path: str,
    etc_mounts: Mapping[str, Path] | None = None,
    limits: Limits = Limits(),
    net_raw: bool = False,
    tmp_in_memory: bool = False,
    slot_filler: Path | None = None,
) -> dict[str, Any]:
    """The OCI ``config.json`` of one sandbox (pure).

    ``etc_mounts``: files bind-mounted over ``/etc/<name>`` (``hosts``, ``hostname``,
    ``resolv.conf``, as ``etc_files`` makes them); the image's own stay where none is given.
    ``slot_filler``: the read-only empty directory unused volume slots show (needed when the
    envd bundle has slots, :func:`volume_mounts`).
    Raises ``InvalidArgument`` for a bad env name, hostname or resource number.
    """
    if spec.cpu_count < 1 or spec.memory_mb < 16:
        raise InvalidArgument("a sandbox needs at least 1 CPU and 16 MiB of memory")
    _check_hostname(spec.hostname)
    env = dict(DEFAULT_ENV)
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidArgument(f"invalid environment variable name {key!r}")
        env[key] = value
    caps = list(CAPABILITIES) + (["CAP_NET_RAW"] if net_raw else [])
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": ENVD_MOUNT,
            "type": "bind",
            "source": str(spec.envd_bundle),
            "options": ["rbind", "ro"],
        },
    ]
    if tmp_in_memory:
        # With the root's writes on the host, a file open and deleted there makes every
        # checkpoint fail (the gofer cannot restore it); temporary files are where programs
        # do that, so /tmp stays in sandbox memory (docs/spikes/workspace-gvisor.md).
        mounts.append(
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", f"size={max(16, spec.memory_mb // 2)}m"]}
        )
    sudo = spec.envd_bundle / "bin" / "sudo"
    if sudo.exists():
        # The runtime sets no_new_privs on every task, so setuid sudo cannot elevate: this
        # stand-in (envd/launcher/sudo.c) asks envd to run the command. /usr/local/bin comes
        # before /usr/bin in every login PATH, so it shadows the image's sudo.
        mounts.append(
            {"destination": SUDO_PATH, "type": "bind", "source": str(sudo),
             "options": ["bind", "ro"]}
        )
    mounts += volume_mounts(spec, slot_filler)
    for name, source in sorted((etc_mounts or {}).items()):
        mounts.append(
            {
                "destination": f"/etc/{name}",
                "type": "bind",
                "source": str(source),
                "options": ["rbind", "rw"],
            }
        )
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": envd_argv(spec, limits),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": {kind: caps for kind in ("bounding", "effective", "permitted")},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": limits.nofile, "soft": limits.nofile},
                {"type": "RLIMIT_NPROC", "hard": limits.nproc, "soft": limits.nproc},
            ],
            "noNewPrivileges": False,
        },
        "root": {"path": str(spec.rootfs), "readonly": False},
        "hostname": spec.hostname,
        "mounts": mounts,
        "annotations": {
            SANDBOX_ID_ANNOTATION: spec.sandbox_id,
            CONTAINER_NAME_ANNOTATION: CONTAINER_NAME,
        },
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network", "path": net.netns_path},
            ],
            "cgroupsPath": cgroups_path,
            "resources": {
                "memory": {"limit": spec.memory_mb * 1024 * 1024},
                "cpu": {
                    "quota": spec.cpu_count * CPU_PERIOD_US,
                    "period": CPU_PERIOD_US,
                    "shares": 1024 * spec.cpu_count,
                },
                "pids": {"limit": limits.pids},
            },
        },
    }


def etc_files(spec: SandboxSpec, net: NetSlot, dns_servers: tuple[str, ...]) -> dict[str, str]:
    """Contents of the sandbox's ``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf``
    (the last only when ``dns_servers`` is not empty)."""
    files = {
        "hostname": f"{spec.hostname}\n",
        "hosts": (
            "127.0.0.1\tlocalhost\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"{net.guest_ip}\t{spec.hostname}\n"
        ),
    }
    if dns_servers:
        files["resolv.conf"] = "".join(f"nameserver {s}\n" for s in dns_servers)
    return files


def write_etc(etc_dir: Path, files: Mapping[str, str]) -> dict[str, Path]:
    """Write ``files`` (name → text) into ``etc_dir`` (created); name → path, for
    ``sandbox_config(etc_mounts=…)``."""
    etc_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in files.items():
        path = etc_dir / name
        path.write_text(text)
        path.chmod(0o644)
        paths[name] = path
    return paths


def write_config(bundle: Path, config: Mapping[str, Any]) -> None:
    """Write ``bundle/config.json``; runsc reads it once, at create."""
    (bundle / "config.json").write_text(json.dumps(config, indent=1))


def read_config(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return data


def _check_hostname(name: str) -> None:
    labels = name.split(".")
    ok = 0 < len(name) <= 253 and all(
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        for label in labels
    )
    if not ok:
        raise InvalidArgument(f"invalid hostname {name!r}")


def volume_mounts(spec: SandboxSpec, slot_filler: Path | None) -> list[dict[str, Any]]:
    """The sandbox's volumes. With an envd bundle that has volume slots
    (``envd/volume_binds.py``): every slot, the k-th showing the k-th volume or else
    ``slot_filler`` (envd binds each where it belongs). With an older bundle: each volume
    bound at its path (its images were taken so).

    Shared file access (runsc's default for mounts): what the content API or another sandbox
    writes on the host is seen at once, as E2B's uncached NFS mounts are. Raises
    ``InvalidArgument`` for more volumes than slots, or slots without a filler.
    """
    slots = volume_binds.slot_count(spec.envd_bundle)
    if not slots:
        return [{"destination": v.destination, "type": "bind", "source": str(v.source),
                 "options": ["rbind", "ro" if v.read_only else "rw"]} for v in spec.volumes]
    if len(spec.volumes) > slots:
        raise InvalidArgument(f"a sandbox mounts at most {slots} volumes")
    if slot_filler is None:
        raise InvalidArgument("volume slots need a filler directory")
    # Always read-write here: a read-only volume's source refuses writes on the host.
    sources = [v.source for v in spec.volumes] + [slot_filler] * (slots - len(spec.volumes))
    return [{"destination": volume_binds.slot_path(k), "type": "bind", "source": str(source),
             "options": ["rbind", "rw"]} for k, source in enumerate(sources)]


def write_bundle(bundle: Path, spec: SandboxSpec, net: NetSlot, *,
                 dns_servers: tuple[str, ...], cgroups_path: str, limits: Limits,
                 net_raw: bool, tmp_in_memory: bool, slot_filler: Path | None) -> None:
    """A new OCI bundle directory for ``spec``: its ``/etc`` files and ``config.json``."""
    bundle.mkdir(parents=True)
    etc = write_etc(bundle / "etc", etc_files(spec, net, dns_servers))
    write_config(bundle, sandbox_config(
        spec, net, cgroups_path=cgroups_path, etc_mounts=etc, limits=limits, net_raw=net_raw,
        tmp_in_memory=tmp_in_memory, slot_filler=slot_filler))

