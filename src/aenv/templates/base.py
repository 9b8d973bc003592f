"""The built-in ``base`` template (Debian bookworm dev box); ``busybox.py`` has the tiny one.

Owns how these two root filesystems are made; the result of each is one immutable layer in a
:class:`aenv.storage.layers.LayerStore`, keyed by the sha256 of its recipe, so building twice is
a no-op and every node building the same recipe gets the same id. Turning a layer into a
committed template snapshot (manifest, memory image) is the template service's job, not this
module's; mounting it is :mod:`aenv.storage.rootfs`'s.

``base`` is ``mmdebstrap --variant=minbase`` (what the official ``debian`` images are: the
Essential and required packages) plus the tools agents expect from E2B's base image (python3 with
pip and venv, git, curl, sudo, ...), without docs, man pages and translations, like the
``-slim`` images. A customization script then adds the user ``user`` (uid/gid 1000, passwordless
sudo), hostname, hosts, a resolver placeholder and C.UTF-8 defaults. mmdebstrap's status log is
followed while it runs and turned into ``on_progress(message, fraction)`` calls
(:mod:`aenv.templates.mmdebstrap`).

Change :data:`BASE_BUILDER_VERSION` whenever the Python code
here changes what ends up in a layer: the recipe hash covers the package list, sources, script
text and tool version, but not this module's code.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.core.errors import FailedPrecondition
from aenv.storage.layers import Layer, LayerStore, layer_id_for
from aenv.templates.mmdebstrap import MmdebstrapProgress, mmdebstrap_version, run_following

#: ``on_progress(message, fraction)``: fraction in [0, 1] and never decreasing, or ``None`` when
#: a message carries no estimate. Called from the event loop thread; it must not block.
ProgressCallback = Callable[[str, float | None], None]

#: Bump when this module changes the content of the ``base`` layer in a way the recipe misses.
BASE_BUILDER_VERSION = 2
#: A cold build downloads ~80 MB and takes 1-2 minutes on a good link; a slow mirror can take
#: ten times that. Past this, something hangs.
BASE_BUILD_TIMEOUT_S = 1800.0

#: Packages on top of minbase: close to E2B's base image minus the compilers (build-essential
#: alone would double the layer); agents can still ``sudo apt-get install`` what they miss.
BASE_PACKAGES: tuple[str, ...] = (
    "bash",
    "ca-certificates",
    "coreutils",
    "curl",
    "git",
    "iproute2",
    "iputils-ping",
    "jq",
    "less",
    "nano",
    "netbase",
    "nodejs",
    "procps",
    "python-is-python3",
    "python3",
    "python3-pip",
    "python3-venv",
    "sudo",
    "tzdata",
    "unzip",
    "wget",
    "xz-utils",
    "zip",
)

#: Kept out of the layer (and out of later ``apt-get install`` in the sandbox), as in the
#: ``debian:*-slim`` images: documentation, man/info pages and translations.
BASE_DPKG_OPTIONS: tuple[str, ...] = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)

#: The sandbox's hostname until the runtime sets its own; also resolvable via /etc/hosts so
#: that ``sudo`` does not complain.
HOSTNAME = "sandbox"

_HOSTS = f"""\
127.0.0.1\tlocalhost
127.0.1.1\t{HOSTNAME}
::1\t\tlocalhost ip6-localhost ip6-loopback
ff02::1\t\tip6-allnodes
ff02::2\t\tip6-allrouters
"""

_RESOLV_CONF = """\
# Placeholder: aenv's runtime replaces this with the sandbox's resolver when it starts.
nameserver 8.8.8.8
nameserver 1.1.1.1
"""

#: Runs inside the new root (chroot, as root) after all packages are installed.
BASE_CUSTOMIZE_SCRIPT = f"""\
#!/bin/sh
# aenv base template customization (runs chrooted in the new root filesystem).
set -eu

# E2B's default user: uid/gid 1000, home /home/user, bash, passwordless sudo.
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --groups sudo --create-home --home-dir /home/user \\
    --shell /bin/bash --comment user user
chmod 0755 /home/user
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\\n' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo --check --quiet --file=/etc/sudoers.d/user

printf '%s\\n' '{HOSTNAME}' > /etc/hostname
cat > /etc/hosts <<'EOF'
{_HOSTS}EOF
cat > /etc/resolv.conf <<'EOF'
{_RESOLV_CONF}EOF
chmod 0644 /etc/hostname /etc/hosts /etc/resolv.conf

# C.UTF-8 is built into glibc: no locales package needed.
printf 'LANG=C.UTF-8\\n' > /etc/default/locale
cat > /etc/profile.d/aenv.sh <<'EOF'
# aenv sandbox defaults for login shells.
export LANG="${{LANG:-C.UTF-8}}"
EOF

# Login shells without sub-processes: the E2B SDK runs every command as "bash -l -c", and
# in a sandbox each fork+exec costs ~20 ms, so Debian's "$(id -u)" in /etc/profile and root's
# "mesg n" (a no-op without a terminal) would triple the cost of a trivial command. bash has
# $EUID; other shells (dash: no EUID) still ask id. Both files are admin-owned (base-files
# installs them only when missing and leaves edited ones alone).
sed -i 's/"$(id -u)"/"${{EUID:-$(id -u)}}"/g' /etc/profile
grep -q 'EUID:-' /etc/profile
sed -i 's|^mesg n 2> /dev/null [|][|] true$|if [ -t 0 ]; then mesg n 2> /dev/null \\|\\| true; fi|' /root/.profile
grep -q '^if \\[ -t 0 \\]; then mesg n' /root/.profile

# Agents run "pip install x" as a matter of course; in a throwaway sandbox the PEP 668
# guard against breaking the system Python only gets in the way (as in E2B's image).
cat > /etc/pip.conf <<'EOF'
[global]
break-system-packages = true
EOF

# Nothing a layer should carry: package indexes, caches, logs, backup files.
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \\
    /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/apt/* /var/log/*.log
"""


@dataclass(frozen=True)
class BaseRecipe:
    """What the ``base`` template is made of (every field enters the layer id)."""

    suite: str = "bookworm"
    #: Debian archive mirror (an apt-cacher-ng URL works too); security updates come from
    #: ``security_mirror``, set it to ``None`` for a mirror without them.
    mirror: str = "http://deb.debian.org/debian"
    security_mirror: str | None = "http://deb.debian.org/debian-security"
    variant: str = "minbase"
    packages: tuple[str, ...] = BASE_PACKAGES
    dpkg_options: tuple[str, ...] = BASE_DPKG_OPTIONS
    customize_script: str = field(default=BASE_CUSTOMIZE_SCRIPT, repr=False)

    def sources(self) -> list[str]:
        """The apt sources lines the root filesystem is built from (and keeps)."""
        lines = [
            f"deb {self.mirror} {self.suite} main",
            f"deb {self.mirror} {self.suite}-updates main",
        ]
        if self.security_mirror:
            lines.append(f"deb {self.security_mirror} {self.suite}-security main")
        return lines


@dataclass(frozen=True)
class BuildResult:
    """A template layer and how it came to be."""

    layer: Layer
    #: ``False`` when the layer already existed and nothing was built.
    built: bool
    #: Wall time of this call (monotonic clock).
    seconds: float


def debian_architecture() -> str:
    """The host's Debian architecture name (what mmdebstrap builds by default)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf", "i686": "i386"}.get(
        machine, machine
    )


async def base_recipe(recipe: BaseRecipe | None = None) -> dict[str, Any]:
    """The full recipe dict of the ``base`` template (its sha256 is the layer id).

    Prerequisites: mmdebstrap is installed (its version is part of the recipe).
    On success: a JSON-serializable dict.
    On failure: :class:`FailedPrecondition` if mmdebstrap is missing or unusable.
    """
    recipe = recipe or BaseRecipe()
    return {
        "template": "base",
        "builder_version": BASE_BUILDER_VERSION,
        "suite": recipe.suite,
        "variant": recipe.variant,
        "architecture": debian_architecture(),
        "sources": recipe.sources(),
        "packages": sorted(set(recipe.packages)),
        "dpkg_options": list(recipe.dpkg_options),
        "mmdebstrap": await mmdebstrap_version(),
        "customize_sha256": hashlib.sha256(recipe.customize_script.encode()).hexdigest(),
    }


async def build_base(
    store: LayerStore,
    *,
    recipe: BaseRecipe | None = None,
    on_progress: ProgressCallback | None = None,
    timeout: float = BASE_BUILD_TIMEOUT_S,
) -> BuildResult:
    """Build the ``base`` template layer into ``store``, unless it is already there.

    Prerequisites: root (mmdebstrap's root mode creates files owned by any uid); mmdebstrap
    installed; the Debian mirror reachable; ~1 GB free on the store's filesystem.
    On success: the layer (``built=False`` if it already existed: a no-op). It was built in a
    staging directory and renamed into place, so it is complete or absent, never half there;
    leftover staging trees of earlier crashed builds were removed first. ``on_progress`` saw
    messages with a non-decreasing fraction ending at 1.0.
    On failure: :class:`FailedPrecondition` without root or mmdebstrap;
    :class:`aenv.core.errors.CommandError` (its stderr holds the tail of mmdebstrap's log) if
    the build fails, :class:`aenv.core.errors.CommandTimeout` after ``timeout`` seconds. The
    store is left as it was (the staging tree is removed).
    """
    started = time.monotonic()
    report = _Reporter(on_progress)
    recipe = recipe or BaseRecipe()
    full = await base_recipe(recipe)
    layer_id = layer_id_for(full)
    if store.has(layer_id):
        report("base template already built", 1.0)
        return BuildResult(store.get(layer_id), False, time.monotonic() - started)
    if os.geteuid() != 0:
        raise FailedPrecondition("building the base template needs root (mmdebstrap root mode)")
    report("cleaning up leftovers of earlier builds", 0.0)
    await store.clean_staging()
    with tempfile.TemporaryDirectory(prefix="aenv-base-") as scratch:
        script = Path(scratch) / "aenv-customize.sh"
        script.write_text(recipe.customize_script)
        log = Path(scratch) / "mmdebstrap.log"
        async with store.staging(layer_id) as staging:
            argv = [
                "mmdebstrap",
                f"--variant={recipe.variant}",
                f"--architectures={full['architecture']}",
                "--mode=root",
                "--format=directory",
                "--verbose",  # apt/dpkg lines are what the progress estimate counts
                f"--logfile={log}",
                f"--include={','.join(full['packages'])}",
                *(f"--dpkgopt={opt}" for opt in recipe.dpkg_options),
                f"--customize-hook=copy-in {script} /tmp",
                f'--customize-hook=chroot "$1" /bin/sh /tmp/{script.name}',
                recipe.suite,
                str(staging),
                *recipe.sources(),
            ]
            report(f"building Debian {recipe.suite} with mmdebstrap", 0.01)
            await run_following(argv, log, MmdebstrapProgress(report), timeout)
            report("measuring and committing the layer", 0.98)
            layer = await store.put_from_dir(staging, layer_id, recipe=full)
    seconds = time.monotonic() - started
    size_mb = (layer.meta.size_bytes or 0) / 1e6
    report(f"base template ready: {size_mb:.0f} MB, built in {seconds:.0f} s", 1.0)
    return BuildResult(layer, True, seconds)


class _Reporter:
    """Wraps the caller's callback: keeps fractions monotonic and survives a missing one."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self._callback = callback
        self._fraction = 0.0

    def __call__(self, message: str, fraction: float | None) -> None:
        if fraction is not None:
            self._fraction = max(self._fraction, min(1.0, fraction))
        if self._callback is not None:
            self._callback(message, self._fraction if fraction is not None else None)
