"""R for the code-interpreter template: the Debian packages of ``R_PACKAGES`` and all they
need that the ``base`` template lacks, downloaded by the node with apt into
``<cache>/r-debs-<key>`` (``interpreter_inputs.py`` makes them the build's ``r`` context;
``templates/code_interpreter.py`` installs them with dpkg).

apt resolves against the base itself: its dpkg status (what is installed), its sources and
its trusted keys, with package lists of its own under ``<cache>/apt``. Never the host's
lists, sources or package database: they may name other suites and repositories, be stale
or absent. The host's apt configuration (a proxy, a mirror's credentials) still applies, and
apt checks every .deb against the archive's signed indexes.

The key is the base's package database and sources with ``R_PACKAGES``: a node resolves once
per base, so a restart or a new server downloads nothing, and a new base resolves afresh
(maybe to newer versions, which then name a new recipe).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.orchestrator.catalog import BASE
from aenv.orchestrator.context import Node
from aenv.templates import code_interpreter as ci
from aenv.templates.base import debian_architecture

#: An index update (~10 MB) and the debs (~50 MB), on a slow mirror.
APT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class BaseSystem:
    """What apt needs of the base template's root: its ``/etc/apt`` and its dpkg status."""

    etc_apt: Path
    status: Path

    def key(self) -> str:
        """Names the resolution: the same base and packages resolve the same. Blocking."""
        digest = hashlib.sha256(repr((ci.R_PACKAGES, debian_architecture())).encode())
        sources = [self.etc_apt / "sources.list",
                   *sorted((self.etc_apt / "sources.list.d").glob("*"))]
        for path in [self.status, *sources]:
            if path.is_file():
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()


async def base_system(node: Node) -> BaseSystem:
    """The base template's apt directory and package database (the copies its sandboxes see:
    the topmost layer holding them)."""
    layers = (await node.templates.resolve(BASE)).layers
    return BaseSystem(etc_apt=_topmost(layers, "etc/apt"),
                      status=_topmost(layers, "var/lib/dpkg/status"))


def _topmost(layers: Sequence[Path], relative: str) -> Path:
    for layer in reversed(layers):
        if (layer / relative).exists():
            return layer / relative
    raise FailedPrecondition(f"the {BASE} template has no /{relative}")


async def debs(cache: Path, base: BaseSystem, key: str) -> list[Path]:
    """The .debs to install on ``base`` for ``R_PACKAGES``, downloaded unless there."""
    done = cache / f"r-debs-{key[:16]}"
    if not done.is_dir():
        if shutil.which("apt-get") is None:
            raise FailedPrecondition("the code-interpreter template's R packages are fetched "
                                     "with apt-get, which this node does not have")
        staging = cache / "r-debs.partial"
        await asyncio.to_thread(_fresh, staging)
        conf = await asyncio.to_thread(_apt_dir, cache / "apt", base)
        apt = ["apt-get", "-c", str(conf), "--quiet"]
        await proc.run([*apt, "update"], timeout=APT_TIMEOUT_S)
        await proc.run([*apt, "-o", f"Dir::Cache::archives={staging}", "install",
                        "--download-only", "--no-install-recommends", "--no-remove", "--yes",
                        *ci.R_PACKAGES], timeout=APT_TIMEOUT_S)
        await asyncio.to_thread(_commit, staging, done)
    found = sorted(done.glob("*.deb"))
    names = {deb.name.split("_")[0] for deb in found}
    missing = [name for name in ci.R_PACKAGES if name not in names]
    if missing:
        raise FailedPrecondition(f"apt did not bring {', '.join(missing)} into {done}")
    return found


def _fresh(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def _apt_dir(apt: Path, base: BaseSystem) -> Path:
    """``apt`` (lists kept between resolutions, a copy of the base's status: apt takes its
    locks beside it, and the base's layer is shared and read-only) and its config file."""
    for sub in ("lists", "cache", "log"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base.status, apt / "status")
    etc = base.etc_apt
    settings = {
        "Dir::Etc::SourceList": etc / "sources.list",
        "Dir::Etc::SourceParts": etc / "sources.list.d",
        "Dir::Etc::Trusted": etc / "trusted.gpg",
        "Dir::Etc::TrustedParts": etc / "trusted.gpg.d",
        "Dir::Etc::Preferences": etc / "preferences",
        "Dir::Etc::PreferencesParts": etc / "preferences.d",
        "Dir::State": apt,
        "Dir::State::Lists": apt / "lists",
        "Dir::State::status": apt / "status",
        "Dir::Cache": apt / "cache",
        "Dir::Log": apt / "log",
        "Acquire::Languages": "none",
        # The node runs as root and its home may be closed to apt's _apt user; apt would
        # fall back to root with a warning anyway. The hashes are checked either way.
        "APT::Sandbox::User": "root",
    }
    if any('"' in str(value) for value in settings.values()):
        raise FailedPrecondition(f"apt cannot be configured with a path holding a quote: {apt}")
    lines = [f'{name} "{value}";' for name, value in settings.items()]
    # A -c file is read after the host's apt.conf.d: this resolution is nothing the host's
    # hooks (cleaners, notifiers) should see, and only the base's architecture matters.
    lines += ["#clear APT::Update::Pre-Invoke;", "#clear APT::Update::Post-Invoke;",
              "#clear APT::Update::Post-Invoke-Success;", "#clear APT::Architectures;",
              f'APT::Architectures:: "{debian_architecture()}";']
    conf = apt / "apt.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _commit(staging: Path, done: Path) -> None:
    """``staging`` (apt's archive directory) becomes ``done``, with only its debs; the debs of
    earlier resolutions go."""
    for leftover in ("lock", "partial"):
        path = staging / leftover
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for old in done.parent.glob("r-debs-*"):
        shutil.rmtree(old, ignore_errors=True)
    staging.rename(done)
