"""The workload: T tasks, each a small Python repository set up for real inside the sandbox,
then G rollouts of a scripted agent and a reward command.

The setup is the expensive part of an episode, as in SWE-style RL: it generates a package of
``files`` modules, makes a venv and installs the repository's dependencies into it with pip
(real wheels, fetched on the host and uploaded: ``bench/rl/wheelhouse.py``; the sandbox has
no network), installs the package itself through a ``.pth`` file, byte-compiles it, commits
it to a git repository and runs its test suite once. A rollout is a few agent commands (look
at the repository, edit one file, run the tests) and the reward (the test suite, from the
venv). Every mode runs this same :class:`~aenv.rl.Task` and the same :class:`Agent`.
"""

from __future__ import annotations

import shlex

from aenv.rl import RolloutEnv, Task
from bench.rl import wheelhouse

REPO_DIR = "/home/user/repo"
VENV = "/home/user/venv"
#: Modules in each task's generated package: the knob for the setup's cost (a few seconds of
#: real work in a sandbox on this machine at the default).
FILES = 1000

#: Runs in the sandbox with python3 (stdlib only): writes the package, its tests, a venv.
_GENERATE = r"""
import pathlib, sys
task, files, root = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
pkg = root / "pkg{}".format(task)
(pkg / "mods").mkdir(parents=True, exist_ok=True)
(pkg / "__init__.py").write_text("")
(pkg / "mods" / "__init__.py").write_text("")
for i in range(files):
    body = "".join(
        "def f{0}_{1}(x):\n    return (x * {1} + {0}) % 97\n\n".format(i, j)
        for j in range(12))
    (pkg / "mods" / "m{}.py".format(i)).write_text("# module %d of task %d\n" % (i, task) + body)
(pkg / "calc.py").write_text("def add(a, b):\n    return a - b\n")
tests = root / "tests"
tests.mkdir(exist_ok=True)
(tests / "__init__.py").write_text("")
(tests / "test_calc.py").write_text(
    "import unittest\nfrom pkg{0}.calc import add\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n".format(task))
(tests / "test_mods.py").write_text(
    "import importlib, unittest\n"
    "class M(unittest.TestCase):\n"
    "    def test_import(self):\n"
    "        for i in range(0, {0}, 7):\n"
    "            m = importlib.import_module('pkg{1}.mods.m%d' % i)\n"
    "            self.assertEqual(getattr(m, 'f%d_0' % i)(1), i % 97)\n".format(files, task))
"""


def task(index: int, files: int = FILES, wheels: dict[str, bytes] | None = None,
         requirements: tuple[str, ...] = ()) -> Task:
    """Task ``index``: its own package name, so two tasks are two prepared states.
    ``requirements`` are installed from ``wheels`` (``wheelhouse.wheels``)."""
    site = f"{VENV}/lib/python3*/site-packages"
    wheels = wheels or {}
    uploads: dict[str, str | bytes] = {
        f"{wheelhouse.SANDBOX_DIR}/{name}": data for name, data in wheels.items()}
    install: tuple[str, ...] = ()
    if requirements:
        pip = f"{wheelhouse.SANDBOX_DIR}/{wheelhouse.pip_wheel(list(wheels))}/pip"
        install = (
            f"{VENV}/bin/python {pip} install -q --no-index --disable-pip-version-check "
            f"--find-links {wheelhouse.SANDBOX_DIR} {' '.join(map(shlex.quote, requirements))}"
            f" && rm -rf {wheelhouse.SANDBOX_DIR}",
        )
    return Task(
        files={"/tmp/generate.py": _GENERATE, **uploads},
        workdir=REPO_DIR,
        diff_roots=(REPO_DIR,),
        setup=(
            f"python3 /tmp/generate.py {index} {files} {REPO_DIR}",
            f"python3 -m venv --without-pip {VENV} && echo {REPO_DIR} > $(echo {site})/repo.pth",
            *install,
            # Hash-checked: a same-size edit within the second of a timestamp .pyc would be missed.
            f"{VENV}/bin/python -m compileall -q -j 0 --invalidation-mode checked-hash . "
            "> /dev/null",
            # gVisor numbers inodes afresh in a restored sandbox (a fork child, a resume), and
            # git's default stat check then re-hashes every file at a rollout's first
            # `git status` (~1 s here). mtime and size are what stay the same.
            "git init -q && git config core.checkStat minimal && git add -A && "
            "git -c user.email=bench@aenv -c user.name=bench commit -qm setup",
            # The suite once, as an install's smoke check does; it fails (the bug is the task).
            f"{VENV}/bin/python -m unittest -q 2>&1 | tail -1; true",
            # As after a clone: the index is refreshed once the files are older than it, or
            # every `git status` of every rollout re-reads each "racily clean" file.
            "git status --short > /dev/null",
        ),
    )


#: The reward: the task's suite, from the venv; exit 0 is 1.0, any failure 0.0.
REWARD = f"{VENV}/bin/python -m unittest -q"


class Agent:
    """A scripted policy: looks around, fixes the bug on even rollouts (a wrong fix on odd
    ones), runs the tests. Four commands and one edit: a short rollout, as most are."""

    async def act(self, env: RolloutEnv) -> None:
        await env.run("git status --short && git log --oneline | head -1")
        calc = next(p for p in (await env.run("ls -d pkg*")).stdout.split())
        await env.run(f"grep -rn 'return a' {shlex.quote(calc)}/calc.py")
        fix = "a + b" if env.index % 2 == 0 else "a * b"
        await env.edit(f"{calc}/calc.py", "a - b", fix)
        await env.run(f"{VENV}/bin/python -m unittest -q tests.test_calc 2>&1 | tail -1")
