"""Build the envd bundle: a self-contained, read-only envd for images with any libc, or none.

A bundle is built once on the host and bind-mounted read-only into every sandbox, at any mount
point. Its layout::

    bin/envd                      static launcher (launcher/launcher.c), the one entry point
    bin/exec-as                   static helper that switches user and execs (launcher/exec_as.c)
    bin/sudo                      static sudo stand-in that asks envd (launcher/sudo.c)
    bin/busybox                   the host's static busybox: the shell of images that have none
                                  (envd/process/shell.py)
    lib/<loader>                  the dynamic loader named in the interpreter's PT_INTERP
    lib/python3                   the host's CPython interpreter binary
    lib/*.so*                     libpython, libc and every other library, under their sonames
    lib/pythonX.Y/                pruned stdlib, lib-dynload, and site-packages holding only
                                  envd's runtime closure; all of it byte-compiled in advance
    volume-slots                  how many volume slots its sandboxes have (envd/volume_binds.py)
    manifest.json                 versions, input fingerprint, size, where each library came from

This module owns the build: the libraries ``ldd`` reports, stripping debug info, compiling the
launcher, checking that the result imports envd using nothing but its own files, and the atomic
swap into place; what goes in (envd's imports, their distributions' requirements, the pruned
stdlib) and the copy are ``bundle_sources.py``. It runs on the host only: it is not shipped,
and envd never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import Internal, InvalidArgument
from aenv.envd import ENVD_VERSION, volume_binds
from aenv.envd.bundle_sources import (
    PYTHON_IN_BUNDLE,
    STUBS,
    Sources,
    copy_python,
    discover,
    stdlib_files,
)
from aenv.envd.elf import elf_files, elf_interpreter, is_static, native_libraries

#: Bump when the layout or the build steps change, so existing bundles are rebuilt.
BUNDLE_FORMAT = 1

#: The interpreter flags bin/envd runs Python with (launcher.c holds the same list): never put
#: the current directory on sys.path, no site module or user site, never write bytecode.
PYTHON_FLAGS = ("-P", "-S", "-s", "-B")
#: The launcher is static because the image may have no libc; -Werror keeps it warning-free.
LAUNCHER_CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")
#: exec-as is on every command's path and links no libc (launcher/exec_as.c says why); gcc must
#: not turn its loops into calls to a memcpy or memset that is not there.
EXEC_AS_CFLAGS = (*LAUNCHER_CFLAGS, "-nostdlib", "-ffreestanding", "-fno-stack-protector",
                  "-fno-tree-loop-distribute-patterns")


def launcher_cflags(source_name: str) -> tuple[str, ...]:
    """gcc's flags for one of ``launcher/``'s helpers (the bundle's and the tests' builds)."""
    return EXEC_AS_CFLAGS if source_name == "exec_as.c" else LAUNCHER_CFLAGS
#: Unchecked hashes: the bundle is read-only and never changes after the build, so the
#: interpreter must neither stat sources to validate bytecode nor try to rewrite it.
COMPILEALL_FLAGS = ("-q", "-j", "0", "-o", "0", "--invalidation-mode", "unchecked-hash")

#: One build step's worth of a slow machine; the byte-compiler takes longest.
STEP_TIMEOUT_S = 600.0
#: Debian's busybox-static: the shell of last resort for images that have none.
STATIC_BUSYBOX = Path("/bin/busybox")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BundleInfo:
    """What :func:`build_bundle` produced (or found already up to date)."""

    path: Path
    size_bytes: int
    python_version: str
    input_hash: str
    rebuilt: bool
    seconds: float


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: what a bundle holds and what it was built from."""

    format: int
    envd_version: str
    python_version: str
    #: File name of the dynamic loader under ``lib/``.
    loader: str
    #: Distribution name → version, for every third-party distribution in site-packages.
    distributions: dict[str, str]
    #: soname → host path each bundled library was copied from (to notice host upgrades).
    native_sources: dict[str, str]
    #: :func:`_input_hash` of the inputs; equal inputs make a rebuild a no-op.
    input_hash: str
    size_bytes: int

    def save(self, root: Path) -> None:
        (root / "manifest.json").write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, root: Path) -> Manifest | None:
        """The manifest of the bundle at ``root``, or None when there is no complete bundle."""
        try:
            data = json.loads((root / "manifest.json").read_text())
            manifest = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        if manifest.format != BUNDLE_FORMAT or not (root / "bin" / "envd").exists():
            return None
        return manifest


async def build_bundle(
    out: Path, *, force: bool = False, progress: Progress | None = None
) -> BundleInfo:
    """Build the envd bundle into ``out``.

    Prerequisites: a CPython with a shared or static libpython, ``gcc`` with a static libc,
    ``ldd`` and (optionally) ``strip`` on the host; envd's dependencies installed.
    On success: ``out`` holds a complete bundle and its ``manifest.json``. When ``out`` already
    holds a bundle built from the same inputs, nothing is done unless ``force``.
    On failure: ``out`` is left as it was; the half-built ``out.tmp-*`` directory is removed.
    Raises :class:`InvalidArgument` when ``out`` is a non-empty directory that is not a bundle,
    :class:`Internal` when a needed library is missing or the built bundle cannot import envd
    by itself, :class:`~aenv.core.errors.CommandError` when a build command fails.
    """
    say = progress or (lambda _step: None)
    started = time.monotonic()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    async with _build_lock(out):
        sources = await asyncio.to_thread(discover)
        # The swap deletes what was at ``out``: never a directory that is not a bundle.
        is_bundle = (out / "manifest.json").is_file() and (out / "bin" / "envd").is_file()
        if out.exists() and any(out.iterdir()) and not is_bundle:
            raise InvalidArgument(f"{out} exists and is not an envd bundle; choose another --out")
        previous = Manifest.load(out)
        if previous is not None and not force:
            digest = await asyncio.to_thread(_input_digest, sources)
            if previous.input_hash == _input_hash(digest, previous.native_sources):
                return _info(out, previous, rebuilt=False, started=started)
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
        try:
            manifest = await _build_into(tmp, sources, say)
            say("swapping into place")
            await asyncio.to_thread(_swap, tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _info(out, manifest, rebuilt=True, started=started)


def bundle_size(root: Path) -> int:
    """Bytes taken by the files under ``root`` (symlinks count as nothing)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# --- fingerprint ------------------------------------------------------------------------------


def _input_digest(sources: Sources) -> str:
    """A hash of the Python-side inputs: our code by content, installed distributions by
    version and RECORD (which lists every file's hash), the interpreter and stdlib by stat.

    Taken before anything is copied, so an edit during a build makes the next build rebuild.
    """
    h = hashlib.sha256()
    h.update(repr((BUNDLE_FORMAT, sys.version, sys.platform)).encode())
    h.update(Path(__file__).read_bytes() + sources.launcher_c.read_bytes())
    h.update(Path(__file__).with_name("bundle_sources.py").read_bytes())
    for stub in sorted(STUBS.values()):
        h.update(stub.read_bytes())
    h.update(sources.launcher_c.with_name("exec_as.c").read_bytes())
    h.update(sources.launcher_c.with_name("sudo.c").read_bytes())
    if STATIC_BUSYBOX.exists():
        h.update(_stat_key(STATIC_BUSYBOX))
    for rel, content in sources.aenv_files:
        h.update(rel.encode() + b"\0" + content)
    for dist in sources.distributions:
        h.update(repr((dist.metadata["Name"], dist.version, dist.read_text("RECORD"))).encode())
    for src in [sources.interpreter, *(src for src, _rel in stdlib_files(sources))]:
        h.update(_stat_key(src))
    return h.hexdigest()


def _input_hash(python_digest: str, native_sources: dict[str, str]) -> str:
    """The manifest's ``input_hash``: the Python-side digest plus each native library's stat.

    Native libraries are only known after ``ldd``; the manifest remembers where each came from,
    so an unchanged bundle is recognised without running anything.
    """
    h = hashlib.sha256(python_digest.encode())
    for soname, host_path in sorted(native_sources.items()):
        h.update(soname.encode() + _stat_key(Path(host_path)))
    return h.hexdigest()


def _stat_key(path: Path) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{path} missing\n".encode()  # went away: rebuild, and fail there
    return f"{path} {st.st_size} {st.st_mtime_ns}\n".encode()


# --- the build --------------------------------------------------------------------------------


async def _build_into(tmp: Path, sources: Sources, say: Progress) -> Manifest:
    digest = await asyncio.to_thread(_input_digest, sources)
    say("copying the interpreter, stdlib and envd's packages")
    pylib = await asyncio.to_thread(copy_python, tmp, sources)
    lib = tmp / "lib"

    say("collecting shared libraries")
    loader_path = elf_interpreter(sources.interpreter)
    loader = Path(loader_path).name
    native = await native_libraries(await asyncio.to_thread(elf_files, tmp))
    native[loader] = os.path.realpath(loader_path)
    input_hash = _input_hash(digest, native)  # before copying, like the digest
    for soname, src in native.items():
        await asyncio.to_thread(shutil.copy2, src, lib / soname)

    if shutil.which("strip"):
        say("stripping symbols")
        # Debug info and the static symbol table are never mapped at run time; dropping them
        # (the dynamic symbols stay) takes ~40 MB off the bundle and changes no code.
        elves = await asyncio.to_thread(elf_files, tmp)
        await proc.run(["strip", "--strip-unneeded", *map(str, elves)], timeout=STEP_TIMEOUT_S)

    say("compiling the launcher")
    (tmp / "bin").mkdir()
    site = pylib.relative_to(tmp) / "site-packages"
    values = {"ENVD_LOADER": loader, "ENVD_PYTHON": PYTHON_IN_BUNDLE, "ENVD_SITE": str(site)}
    defines = [f'-D{name}="{value}"' for name, value in values.items()]
    launcher = [str(sources.launcher_c), "-o", str(tmp / "bin" / "envd")]
    await proc.run(["gcc", *LAUNCHER_CFLAGS, *defines, *launcher], timeout=STEP_TIMEOUT_S)
    # envd finds it at sys.prefix/bin/exec-as and spawns user commands through it (vfork).
    exec_as = [str(sources.launcher_c.with_name("exec_as.c")), "-o", str(tmp / "bin" / "exec-as")]
    await proc.run(["gcc", *launcher_cflags("exec_as.c"), *exec_as], timeout=STEP_TIMEOUT_S)
    sudo = [str(sources.launcher_c.with_name("sudo.c")), "-o", str(tmp / "bin" / "sudo")]
    await proc.run(["gcc", *LAUNCHER_CFLAGS, *sudo], timeout=STEP_TIMEOUT_S)
    # Sandboxes of this bundle get volume slots (envd/volume_binds.py); the runtime reads it.
    (tmp / volume_binds.MARKER).write_text(f"{volume_binds.SLOTS}\n")
    if STATIC_BUSYBOX.exists() and is_static(STATIC_BUSYBOX):
        await asyncio.to_thread(shutil.copy2, STATIC_BUSYBOX, tmp / "bin" / "busybox")
    else:
        say("no static busybox on this host: images without a shell cannot run commands")

    say("byte-compiling")
    # The host's interpreter is the bundled one, so its bytecode is the bundle's.
    await proc.run(
        [sys.executable, "-m", "compileall", *COMPILEALL_FLAGS, str(pylib)],
        timeout=STEP_TIMEOUT_S,
    )
    await asyncio.to_thread(_normalize_modes, tmp)

    say("checking that envd imports from the bundle alone")
    await _check_isolated(tmp, loader, site)

    manifest = Manifest(
        format=BUNDLE_FORMAT,
        envd_version=ENVD_VERSION,
        python_version=sys.version.split()[0],
        loader=loader,
        distributions={d.metadata["Name"]: d.version for d in sources.distributions},
        native_sources=dict(sorted(native.items())),
        input_hash=input_hash,
        size_bytes=await asyncio.to_thread(bundle_size, tmp),
    )
    manifest.save(tmp)
    return manifest


#: Imports envd's server on the bundled interpreter and lists any file it mapped from outside
#: the bundle: a library the host resolved for us would hide a hole that only the sandbox sees.
#: glibc's locale and gconv data are exempt: it uses the image's when there are any, and
#: works without them (Python then runs in UTF-8 mode).
_CHECK = """
import sys
import aenv.envd.app, aenv.envd.server, aenv.envd.__main__
import aenv.envd.eventloop, uvicorn.protocols.http.httptools_impl, uvicorn.lifespan.on
import httptools, ssl, hashlib
root = sys.argv[1].rstrip("/") + "/"
outside = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(maxsplit=5)
        path = fields[5].strip() if len(fields) == 6 else ""
        if path.startswith("/") and not path.startswith(root):
            if "/locale/" not in path and "/gconv/" not in path:
                outside.add(path)
outside = sorted(outside)
modules = [m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)]
outside += sorted(f for f in modules if not f.startswith(root))
print("\\n".join(outside))
"""


async def _check_isolated(root: Path, loader: str, site: Path) -> None:
    lib = root / "lib"
    python = [str(lib / loader), "--library-path", str(lib), str(root / PYTHON_IN_BUNDLE)]
    done = await proc.run(
        [*python, *PYTHON_FLAGS, "-c", _CHECK, str(root)],
        env={"PYTHONHOME": str(root), "PYTHONPATH": str(root / site), "PATH": "/usr/bin:/bin"},
        timeout=STEP_TIMEOUT_S,
    )
    outside = [line for line in done.text.splitlines() if line.strip()]
    if outside:
        raise Internal(f"the bundled envd loaded files from outside the bundle: {outside}")


def _normalize_modes(root: Path) -> None:
    """World-readable files and directories: envd runs as root but users read the stdlib."""
    for dirpath, _dirnames, filenames in os.walk(root):
        Path(dirpath).chmod(0o755)
        for name in filenames:
            path = Path(dirpath) / name
            executable = path.stat().st_mode & 0o111
            path.chmod(0o755 if executable else 0o644)


def _swap(tmp: Path, out: Path) -> None:
    """Move the finished bundle to ``out``; the previous one, if any, is removed afterwards."""
    old: Path | None = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
        out.rename(old / "bundle")
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _info(out: Path, manifest: Manifest, *, rebuilt: bool, started: float) -> BundleInfo:
    return BundleInfo(
        path=out,
        size_bytes=manifest.size_bytes,
        python_version=manifest.python_version,
        input_hash=manifest.input_hash,
        rebuilt=rebuilt,
        seconds=time.monotonic() - started,
    )


@contextlib.asynccontextmanager
async def _build_lock(out: Path) -> AsyncIterator[None]:
    """One build per output directory at a time (parallel test workers share build/)."""
    fd = os.open(out.parent / f".{out.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
