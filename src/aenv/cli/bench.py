"""``aenv bench``: the benchmarks a user can run from a source checkout (docs/benchmarks.md).

``aenv bench rl`` runs ``bench/rl_bench.py``: the RL rollout workload three ways (cold,
template, fork) and what each costs. The benchmark lives in the repository, next to the test
harness that starts its node, not in the installed package: this command finds the checkout
the package is installed from (an editable install) and imports the benchmark from there. It
owns nothing else: the benchmark writes its own results.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

import aenv
from aenv.cli.common import examples, fail

app = typer.Typer(help="Benchmarks, from a source checkout (docs/benchmarks.md).",
                  no_args_is_help=True)


def _checkout() -> Path | None:
    """The repository the package is installed from, if it has the benchmarks."""
    root = Path(aenv.__file__).resolve().parents[2]
    return root if (root / "bench" / "rl_bench.py").is_file() else None


def _load(module: str) -> Any:
    root = _checkout()
    if root is None:
        fail("the benchmarks need a source checkout of aenv (pip install -e .): "
             "bench/rl_bench.py was not found next to the installed package")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(module)


@app.command(epilog=examples("aenv bench rl --quick",
                             "aenv bench rl --tasks 2 --group 16 --svg docs/img/rl.svg",
                             "E2B_API_URL=http://node:3000 aenv bench rl --modes cold,fork"))
def rl(
    tasks: Annotated[int, typer.Option(help="Tasks, each with its own setup.")] = 2,
    group: Annotated[int, typer.Option(help="Rollouts per task (G).")] = 16,
    modes: Annotated[str, typer.Option(help="Comma-separated: cold, template, fork.")] =
        "cold,template,fork",
    parallel: Annotated[int, typer.Option(help="Agents acting at once, in every mode.")] = 4,
    files: Annotated[int, typer.Option(help="Modules in each task's package (setup cost).")]
        = 1000,
    deps: Annotated[str, typer.Option(help="The repository's dependencies, pip-installed by "
                                           "each setup from real wheels ('none': no install).")]
        = "numpy pandas pytest requests",
    out: Annotated[Path | None, typer.Option(help="The JSON results (default "
                                                  "bench/results/rl.json).")] = None,
    svg: Annotated[Path | None, typer.Option(help="Write the plot here.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="fork: pause finished rollouts "
                                                      "instead of killing them.")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="1 task, G=4.")] = False,
) -> None:
    """Cost of RL rollouts: cold create + setup per episode, a template per task, and fork
    fan-out from a prepared task (environment-seconds, memory GB-hours, disk). Starts a node
    of its own per mode unless E2B_API_URL names one."""
    argv = ["--tasks", str(tasks), "--group", str(group), "--modes", modes,
            "--parallel", str(parallel), "--files", str(files), "--deps", deps]
    argv += ["--out", str(out)] if out is not None else []
    argv += ["--svg", str(svg)] if svg is not None else []
    argv += ["--keep"] if keep else []
    argv += ["--quick"] if quick else []
    code = _load("bench.rl_bench").main(argv)
    raise typer.Exit(code)
