"""One code-interpreter server (aenv.interpreter) on the host for the whole session.

It runs from its own venv (`scripts/interpreter-venv.sh`: ipykernel, bash_kernel, deno,
numpy, pandas, matplotlib, starlette, uvicorn, jupyter_client; made once per machine) with
PYTHONPATH=src, so it imports exactly the package files a sandbox gets. The official
`e2b-code-interpreter` SDK drives it in debug mode: `Sandbox.create()` makes no API or envd
call there, and `E2B_SANDBOX_URL` is the URL every sandbox port resolves to, the
interpreter's port 49999 included, so pointing it at this server is all it takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
#: Making the venv from scratch: pip (numpy, pandas, matplotlib wheels) and npm (deno, ~40 MB).
VENV_TIMEOUT_S = 900
#: The server is ready once the default Python kernel answers: ~2-5 s on a loaded machine.
READY_TIMEOUT_S = 120


@dataclass
class InterpreterServer:
    url: str
    venv: Path
    cwd: Path
    log: Path

    @property
    def deno_missing(self) -> str | None:
        """Why the venv has no deno kernel, or None if it has one."""
        marker = self.venv / ".deno-missing"
        return marker.read_text().strip() if marker.exists() else None


@pytest.fixture(scope="session")
def interpreter_venv() -> Path:
    done = subprocess.run([str(REPO / "scripts" / "interpreter-venv.sh")], capture_output=True,
                          text=True, timeout=VENV_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/interpreter-venv.sh failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def interpreter(interpreter_venv: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[InterpreterServer]:
    scratch = tmp_path_factory.mktemp("interpreter")
    cwd = scratch / "home"
    cwd.mkdir()
    log = scratch / "server.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
    env.update(PYTHONPATH=str(REPO / "src"), INTERPRETER_TEST_MARK="from-the-server")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(interpreter_venv / "bin" / "python"), "-m", "aenv.interpreter",
             "--host", "127.0.0.1", "--port", str(port), "--cwd", str(cwd)],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=scratch)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the interpreter exited ({proc.returncode}):\n"
                            f"{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"no /health in {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield InterpreterServer(url=url, venv=interpreter_venv, cwd=cwd, log=log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            sys.stdout.write("interpreter log has tracebacks:\n" + text[-5000:] + "\n")


@pytest.fixture(autouse=True)
def sdk_debug_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK in debug mode, pointed at the interpreter, for the tests that use it."""
    if "interpreter" in request.fixturenames:
        server: InterpreterServer = request.getfixturevalue("interpreter")
        monkeypatch.setenv("E2B_DEBUG", "true")
        monkeypatch.setenv("E2B_SANDBOX_URL", server.url)


@pytest.fixture
def needs_deno(interpreter: InterpreterServer) -> None:
    if interpreter.deno_missing:
        pytest.skip(f"no deno kernel in the interpreter venv: {interpreter.deno_missing}")
