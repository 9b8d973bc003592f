"""The deployment files (deploy/): Kubernetes manifests valid against the API schema
(kubernetes-validate, strict, offline), and every AENV_* name they set is one aenv reads;
the compose file's services, the systemd units' commands exist."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from aenv.core.settings import Settings
from tests.cli_run import AENV

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: Read by the CLI of one role, not by the node's settings.
CLI_NAMES = {"AENV_SCHEDULER", "AENV_GATEWAY_LISTEN", "AENV_SCHEDULER_LISTEN"}
KNOWN = {f"AENV_{name.upper()}" for name in Settings.model_fields} | CLI_NAMES


def _documents(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", sorted((DEPLOY / "k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifests_are_valid(path: Path) -> None:
    for document in _documents(path):
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def _names(text: str) -> set[str]:
    return set(re.findall(r"\b(AENV_[A-Z0-9_]+)\b", text))


@pytest.mark.parametrize("path", [*sorted((DEPLOY / "k8s").glob("*.yaml")),
                                  DEPLOY / "compose.yaml", DEPLOY / "install.sh"],
                         ids=lambda p: p.name)
def test_every_setting_named_is_one_aenv_reads(path: Path) -> None:
    unknown = _names(path.read_text()) - KNOWN
    assert not unknown, f"{path.name} sets {sorted(unknown)}, which nothing reads"


def test_compose_has_the_whole_cluster() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"redis", "minio", "scheduler", "gateway", "node-a", "node-b"} <= set(services)
    for name in ("node-a", "node-b"):
        assert services[name]["privileged"] is True
        env = services[name]["environment"]
        assert env["AENV_ADVERTISE"] == f"http://{name}:3000"
        assert env["AENV_CLUSTER"].startswith("redis://")


@pytest.mark.parametrize("path", sorted((DEPLOY / "systemd").glob("*.service")),
                         ids=lambda p: p.name)
def test_systemd_units_run_commands_that_exist(path: Path) -> None:
    unit = configparser.ConfigParser(interpolation=None)
    unit.read(path)
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[0] == "/opt/aenv/venv/bin/aenv"
    command = argv[1]
    helped = subprocess.run([str(AENV), command, "--help"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert helped.returncode == 0, helped.stderr
    for option in (a for a in argv[2:] if a.startswith("--")):
        assert option in helped.stdout, f"aenv {command} has no {option}"
