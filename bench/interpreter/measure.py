"""The three pairs of measurements (see the package docstring); each returns its samples."""

from __future__ import annotations

import contextlib
import time

from e2b import Sandbox as PlainSandbox
from e2b_code_interpreter import Sandbox as InterpreterSandbox

from aenv.client.sync import Client
from bench.interpreter.common import SANDBOX_TIMEOUT_S, log, ms_since

Samples = dict[str, list[float]]


def first_run(runs: int) -> Samples:
    out: Samples = {"create_interpreter": [], "first_run_code": [], "create_plain": [],
                    "first_command": []}
    for i in range(runs):
        t0 = time.perf_counter()
        sbx = InterpreterSandbox.create(timeout=SANDBOX_TIMEOUT_S)
        out["create_interpreter"].append(ms_since(t0))
        t0 = time.perf_counter()
        assert sbx.run_code("1 + 1").text == "2"
        out["first_run_code"].append(ms_since(t0))
        sbx.kill()
        t0 = time.perf_counter()
        plain = PlainSandbox.create(timeout=SANDBOX_TIMEOUT_S)
        out["create_plain"].append(ms_since(t0))
        t0 = time.perf_counter()
        plain.commands.run("true")
        out["first_command"].append(ms_since(t0))
        plain.kill()
        log(f"  first run {i + 1}/{runs}")
    return out


def round_trips(runs: int) -> Samples:
    out: Samples = {"run_code": [], "command_true": []}
    sbx = InterpreterSandbox.create(timeout=SANDBOX_TIMEOUT_S)
    plain = PlainSandbox.create(timeout=SANDBOX_TIMEOUT_S)
    try:
        for _ in range(3):  # warm-up
            sbx.run_code("x = 1")
            plain.commands.run("true")
        for _ in range(runs):
            t0 = time.perf_counter()
            sbx.run_code("x = 1")
            out["run_code"].append(ms_since(t0))
            t0 = time.perf_counter()
            plain.commands.run("true")
            out["command_true"].append(ms_since(t0))
    finally:
        sbx.kill()
        plain.kill()
    return out


def fork16(client: Client, runs: int, count: int = 16) -> Samples:
    out: Samples = {"fork_interpreter": [], "fork_plain": []}
    sbx = InterpreterSandbox.create(timeout=SANDBOX_TIMEOUT_S)
    plain = PlainSandbox.create(timeout=SANDBOX_TIMEOUT_S)
    try:
        sbx.run_code("import numpy as np, pandas as pd\n"
                     "prepared = pd.DataFrame({'a': np.arange(1000)})")
        for i in range(runs):
            for parent, key in ((sbx.sandbox_id, "fork_interpreter"),
                                (plain.sandbox_id, "fork_plain")):
                t0 = time.perf_counter()
                children = client.fork(parent, count, timeout=SANDBOX_TIMEOUT_S)
                out[key].append(ms_since(t0))
                assert not children.errors and len(children) == count, children.errors
                if key == "fork_interpreter":
                    child = InterpreterSandbox.connect(children[-1].sandbox_id)
                    assert child.run_code("int(prepared['a'].sum())").text == "499500"
                for c in children:
                    with contextlib.suppress(Exception):
                        c.kill()
            log(f"  fork x{count} {i + 1}/{runs}")
    finally:
        sbx.kill()
        plain.kill()
    return out
