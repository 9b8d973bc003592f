"""What goes into the envd bundle: the stdlib pruning, envd's import closure, and the copy.

The half of the bundle build (``envd/bundle.py``) that decides what is shipped: the aenv files
envd imports (followed transitively), the third-party distributions they need (their
requirements' closure), the pruned stdlib, and the stubs that replace distributions envd imports
but never runs (``envd/stubs/``). Host-side only, like bundle.py: never shipped.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

import aenv
from aenv.core.errors import Internal

#: Where the interpreter sits inside the bundle (the launcher is compiled with the same value).
PYTHON_IN_BUNDLE = "lib/python3"

#: Top-level stdlib modules envd never imports. The GUI and terminal ones are also what would
#: pull in Tk, ncurses and libreadline; nis would pull in Kerberos.
_TESTS = {"test", "_ctypes_test", "_testbuffer", "_testcapi", "_testclinic", "_testmultiphase"}
_MORE_TESTS = {"_testimportmultiple", "_testinternalcapi", "_xxtestfuzz", "xxlimited"}
_UIS = {"idlelib", "tkinter", "_tkinter", "turtle", "turtledemo", "curses", "_curses"}
_MORE_UIS = {"_curses_panel", "readline", "ossaudiodev", "pydoc_data"}
_TOOLS = {"ensurepip", "lib2to3", "distutils", "nis", "sqlite3", "_sqlite3", "xxlimited_35"}
_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}
DROPPED_MODULES = frozenset(_TESTS | _MORE_TESTS | _UIS | _MORE_UIS | _TOOLS | _NOT_STDLIB)
#: Directories dropped at any depth (``unittest/test``, ``distutils/tests`` …).
DROPPED_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__"})
#: Files nobody runs from a bundle: bytecode of other builds, stubs, C/Cython sources, Windows
#: launchers. Bytecode is regenerated for this exact interpreter.
DROPPED_SUFFIXES = (".pyc", ".pyo", ".pyi", ".c", ".h", ".pyx", ".pxd", ".pxi", ".exe")

#: Distributions envd needs without an ``import`` statement naming them: uvicorn imports its
#: HTTP implementation from a string in server.py's config, starlette imports
#: python-multipart when a ``/files`` upload is parsed, and the filesystem watcher is built on
#: inotify-simple.
EXTRA_ROOT_DISTRIBUTIONS = ("httptools", "python-multipart", "inotify-simple")

#: The aenv package ships as envd/ plus the aenv modules it imports, followed transitively, so
#: host-side modules next to them (core/settings/, cli/, orchestrator/) stay out.
#: The bundle builder and the launcher's C source are host-side too.
AENV_EXCLUDED = frozenset(
    {"envd/bundle.py", "envd/bundle_sources.py", "envd/elf.py", "envd/launcher", "envd/stubs"}
)

#: Distributions replaced by a stub module of ours (file under ``envd/stubs/``), with none of
#: their requirements. pyqwest is the Rust HTTP stack of connectrpc's *client*: the generated
#: ``*_connect.py`` modules import the client classes and connectrpc's gRPC server protocol
#: imports ``pyqwest.Headers``, but the Connect server envd runs never calls either. Its
#: extension is resident in full inside gVisor: ~12 MiB per sandbox, plus opentelemetry-api.
STUBS: dict[str, Path] = {
    "pyqwest": Path(__file__).resolve().parent / "stubs" / "pyqwest.py",
}


@dataclass(frozen=True)
class Sources:
    """Everything a bundle is made from, found on the host."""

    interpreter: Path
    stdlib: Path
    dynload: Path
    distributions: tuple[metadata.Distribution, ...]
    #: (path relative to the aenv package, content) of the aenv files envd runs on, read once
    #: so that what is hashed is exactly what is shipped, even while someone edits the tree.
    aenv_files: tuple[tuple[str, bytes], ...]
    launcher_c: Path

    @property
    def python_dir(self) -> str:
        return f"python{sys.version_info.major}.{sys.version_info.minor}"


# --- discovery -------------------------------------------------------------------------------


def discover() -> Sources:
    base = Path(sys.base_prefix)
    interpreter = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": str(base)}))
    dynload = Path(sysconfig.get_path("platstdlib", vars={"platbase": str(base)})) / "lib-dynload"
    aenv_files = _aenv_files(Path(aenv.__file__).resolve().parent)
    roots = sorted(_third_party_imports(aenv_files)) + list(EXTRA_ROOT_DISTRIBUTIONS)
    return Sources(
        interpreter=interpreter,
        stdlib=stdlib,
        dynload=dynload,
        distributions=tuple(_requirement_closure(roots)),
        aenv_files=tuple(aenv_files),
        launcher_c=Path(__file__).resolve().parent / "launcher" / "launcher.c",
    )


def _aenv_files(aenv_dir: Path) -> list[tuple[str, bytes]]:
    """(path relative to the aenv package, content) of every aenv file the bundle ships."""
    envd = [p for p in (aenv_dir / "envd").rglob("*.py") if "__pycache__" not in p.parts]
    pending = [aenv_dir / "__init__.py", *envd]
    found: dict[str, bytes] = {}
    while pending:
        path = pending.pop()
        rel = path.relative_to(aenv_dir).as_posix()
        if rel in found or any(rel == ex or rel.startswith(ex + "/") for ex in AENV_EXCLUDED):
            continue
        found[rel] = path.read_bytes()
        for module in _imported_modules(rel, found[rel]):
            parts = module.split(".")
            if parts[0] != "aenv":
                continue
            for depth in range(2, len(parts) + 1):  # each package on the way, then the module
                stem = aenv_dir.joinpath(*parts[1:depth])
                pending += [
                    p for p in (stem / "__init__.py", stem.with_suffix(".py")) if p.is_file()
                ]
    return sorted(found.items())


def _imported_modules(rel: str, source: bytes) -> set[str]:
    """Modules an aenv file may import: ``from a import b`` names both ``a`` and ``a.b``."""
    package = ["aenv", *rel.split("/")[:-1]]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _third_party_imports(files: list[tuple[str, bytes]]) -> set[str]:
    """Distributions providing the top-level modules (outside the stdlib and aenv) ``files``
    import."""
    found = {m.split(".")[0] for rel, source in files for m in _imported_modules(rel, source)}
    found -= set(sys.stdlib_module_names) | {"aenv", "__future__"}
    owners = metadata.packages_distributions()
    missing = sorted(name for name in found if name not in owners)
    if missing:
        raise Internal(f"envd imports {missing}, which no installed distribution provides")
    return {dist for name in found for dist in owners[name]}


def _requirement_closure(roots: Iterable[str]) -> Iterator[metadata.Distribution]:
    """The distributions ``roots`` need at run time on this interpreter, roots included."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = _canonical(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        if name in STUBS:
            continue  # copy_python writes the stub instead
        dist = metadata.distribution(name)
        yield dist
        for line in dist.requires or ():
            req = Requirement(line)
            # No extras are installed for envd, so markers are evaluated with extra="".
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- copying ----------------------------------------------------------------------------------


def _dropped(rel: Path, *, is_dir: bool) -> bool:
    """Whether a stdlib path (relative to the stdlib directory) stays out of the bundle."""
    first = rel.parts[0]
    if first.split(".")[0] in DROPPED_MODULES or first.startswith("config-"):
        return True  # config-*: libpython.a and the Makefile, only for building C extensions
    if is_dir:
        return rel.name in DROPPED_DIRS
    return rel.name.endswith(DROPPED_SUFFIXES)


def stdlib_files(sources: Sources) -> Iterator[tuple[Path, Path]]:
    """(source, destination relative to lib/pythonX.Y) for the pruned stdlib and lib-dynload."""
    for top, dest in ((sources.stdlib, Path()), (sources.dynload, Path("lib-dynload"))):
        for dirpath, dirnames, filenames in os.walk(top):
            here = Path(dirpath)
            rel_dir = here.relative_to(top)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if here / d != sources.dynload and not _dropped(rel_dir / d, is_dir=True)
            )
            for name in sorted(filenames):
                if not _dropped(rel_dir / name, is_dir=False):
                    yield here / name, dest / rel_dir / name


def _distribution_files(dist: metadata.Distribution) -> Iterator[tuple[Path, Path]]:
    """(source, destination relative to site-packages) for one installed distribution."""
    for file in dist.files or ():
        rel = Path(str(file))
        if rel.parts[0] == ".." or rel.name in ("RECORD", "INSTALLER", "REQUESTED"):
            continue  # scripts in bin/, and pip's bookkeeping
        if any(part in DROPPED_DIRS for part in rel.parts[:-1]):
            continue
        if rel.name.endswith(DROPPED_SUFFIXES) or rel.suffix == ".pth":
            continue
        yield Path(str(dist.locate_file(file))), rel


def copy_python(tmp: Path, sources: Sources) -> Path:
    """Copy the interpreter, stdlib, third-party closure and aenv; return the pythonX.Y dir."""
    pylib = tmp / "lib" / sources.python_dir
    site = pylib / "site-packages"
    copies: list[tuple[Path, Path]] = [(sources.interpreter, tmp / PYTHON_IN_BUNDLE)]
    copies += [(src, pylib / rel) for src, rel in stdlib_files(sources)]
    for dist in sources.distributions:
        copies += [(src, site / rel) for src, rel in _distribution_files(dist)]
    for src, dst in copies:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for rel, content in sources.aenv_files:
        (site / "aenv" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "aenv" / rel).write_bytes(content)
    for name, stub in STUBS.items():
        (site / name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(stub, site / name / "__init__.py")
    return pylib


