"""The gateway's and scheduler's settings: sources, one-line errors, the generated reference.

No Redis and no node: an invalid setting stops the command before it connects anywhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from aenv.cluster.settings import GatewaySettings, SchedulerSettings, reference_markdown
from aenv.core.settings import Settings
from tests.cli_run import AENV

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
BEGIN, END = "<!-- cluster-settings:begin -->\n", "<!-- cluster-settings:end -->"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AENV_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AENV_CONFIG", str(tmp_path / "none.toml"))


def test_reference_in_docs_is_current() -> None:
    text = DOCS.read_text()
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert table == reference_markdown(), "run: python -m aenv.cluster.settings, paste it " \
                                          "into docs/deployment.md between the markers"


def test_defaults_are_the_nodes() -> None:
    gateway = GatewaySettings()
    node = Settings()
    assert gateway.scheduler == "http://127.0.0.1:9090" and gateway.api_key is None
    assert gateway.cluster is None and SchedulerSettings().key_quota == 0
    assert gateway.body_limits().api == node.max_body_bytes
    assert gateway.idle_timeout_s == node.idle_timeout_s
    assert gateway.connection_limits().max_header_bytes == node.max_header_bytes


def test_options_over_environment_over_a_shared_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "aenv.toml"
    # A node's file: its own keys (home, listen) are ignored here, the shared ones are read.
    config.write_text('home = "/srv/aenv"\nlisten = "0.0.0.0:3000"\n'
                      'cluster = "redis://file:6379/0"\nmax_body_bytes = 1000\n'
                      'api_key = "e2b_file"\n')
    monkeypatch.setenv("AENV_CONFIG", str(config))
    monkeypatch.setenv("AENV_MAX_BODY_BYTES", "2000")
    monkeypatch.setenv("AENV_SCHEDULER", "http://env:9090")
    monkeypatch.setenv("AENV_KEY_QUOTA", "7")
    gateway = GatewaySettings(scheduler="http://option:9090")
    assert gateway.cluster == "redis://file:6379/0" and gateway.api_key == "e2b_file"
    assert gateway.max_body_bytes == 2000  # the environment wins over the file
    assert gateway.scheduler == "http://option:9090"  # the option over the environment
    assert SchedulerSettings().key_quota == 7
    assert Settings().max_body_bytes == 2000  # and the node reads the same file and variable


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    return subprocess.run([str(AENV), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "env", "says"), [
    (["scheduler"], {"AENV_CLUSTER": "redis://h:1/0", "AENV_KEY_QUOTA": "x"},
     "AENV_KEY_QUOTA='x': Input should be a valid integer"),
    (["gateway", "--scheduler", "10.0.0.3:9090"], {"AENV_CLUSTER": "redis://h:1/0"},
     "--scheduler '10.0.0.3:9090': String should match pattern"),
    (["gateway"], {"AENV_CLUSTER": "http://h:1", "AENV_MAX_BODY_BYTES": "-1"},
     "AENV_MAX_BODY_BYTES='-1': Input should be greater than 0"),
    (["scheduler"], {}, "no cluster: pass --cluster"),
    (["node", "ls", "--cluster", "h:6379"], {}, "--cluster 'h:6379'"),
])
def test_an_invalid_setting_is_one_line(args: list[str], env: dict[str, str], says: str,
                                        tmp_path: Path) -> None:
    done = _run(*args, AENV_CONFIG=str(tmp_path / "none.toml"), **env)
    assert done.returncode == 1, done
    assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: invalid configuration: ") or line.startswith("error: no"), line
    assert says in line, line
