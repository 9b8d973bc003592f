"""The Harbor classes: ``AenvEnvironment`` (one trial's sandbox) and ``AenvJobPlugin``.

This module imports Harbor (Python >= 3.12); reach it through :mod:`aenv.integrations.harbor`
(``-e aenv.integrations.harbor:AenvEnvironment``), whose module docstring says what the
integration owns. In aenv's 3.11 venv, where Harbor is absent, mypy sees Harbor's names as
``Any`` (``ignore_missing_imports``) and checks the rest.

start
  Prerequisites: the task has ``environment/Dockerfile`` (or ``[environment] docker_image``)
  whose ``FROM`` the node resolves offline (``e2bdev/base``, a template, a reachable registry);
  ``E2B_API_URL``/``E2B_API_KEY`` (or ``aenv auth``) name the node.
  On success: the trial's sandbox is a fork child (``RolloutPool.fork``) of its template's
  prepared parent (an :mod:`aenv.rl` prepared task), with ``/logs/{agent,verifier,artifacts}``;
  the template was built (or found) and the parent prepared by the first trial of the
  process that needed them.
  On failure: the build's or the node's error (``aenv.client`` errors: ``CapacityError``,
  ``SandboxLost``… infrastructure, apart from the task); Harbor records it as the trial's
  exception, not as a reward.
stop
  Kills the child through the pool (``delete``; with ``--no-delete`` it is left to the job's
  end). Never raises: a child that is gone already is what stop wants.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import parse_dockerfile_workdir
from harbor.models.job.plugin import BaseJobPlugin

from aenv.client import Sandbox
from aenv.integrations.harbor import (
    SANDBOX_TIMEOUT_S,
    Pool,
    TemplateSpec,
    close_pools,
    download_tree,
    log,
    pool,
    template_name,
    upload_tree,
)

#: The user a command runs as when neither Harbor nor the Dockerfile names one: root, as
#: ``docker exec`` runs in an image without ``USER`` (the node's base template would say
#: ``user``).
DEFAULT_USER = "root"


class AenvEnvironment(BaseEnvironment):
    """A Harbor environment on an aenv node: template once, prepared parent once, fork per
    trial. Options (``--ek key=value``): ``run_id`` (the run label; default ``harbor-<job
    name>``), ``sandbox_timeout_sec`` (default 3600)."""

    def __init__(self, *args: Any, run_id: str | None = None,
                 sandbox_timeout_sec: int | str = SANDBOX_TIMEOUT_S, **kwargs: Any) -> None:
        self._run_id = run_id
        self._sandbox_timeout_s = int(sandbox_timeout_sec)
        self._sandbox: Sandbox | None = None
        self._pool: Pool | None = None
        super().__init__(*args, **kwargs)
        dockerfile = self.environment_dir / "Dockerfile"
        self._dockerfile = dockerfile if dockerfile.is_file() else None
        self._workdir = parse_dockerfile_workdir(dockerfile) if self._dockerfile else None
        self._image_user = _dockerfile_user(dockerfile) if self._dockerfile else None

    @staticmethod
    def type() -> str:
        return "aenv"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        if not (self.environment_dir / "Dockerfile").is_file() and \
                not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{self.environment_dir / 'Dockerfile'} not found and no "
                                    "[environment] docker_image: aenv needs one of them")

    @property
    def run_id(self) -> str:
        """The run label of this trial's sandboxes (``aenv kill --metadata run=<it>``)."""
        return self._run_id or f"harbor-{self.trial_paths.trial_dir.parent.name}"

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment is not started")
        return self._sandbox

    async def start(self, force_build: bool) -> None:
        spec = TemplateSpec(template_name(self.environment_id), self.environment_dir,
                            dockerfile=self._dockerfile,
                            image=self.task_env_config.docker_image)
        self._pool = pool(self.run_id, sandbox_timeout_s=self._sandbox_timeout_s)
        self._sandbox = await self._pool.child(spec, force_build=force_build)
        self.logger.info(f"aenv sandbox {self._sandbox.sandbox_id} (template {spec.name}, "
                         f"run {self.run_id})")
        await self.ensure_dirs(self._mount_targets(writable_only=True))

    async def stop(self, delete: bool) -> None:
        if self._sandbox is None or self._pool is None or not delete:
            return
        # The pool logs a failed kill: the child ends by its timeout, or with the pool.
        await self._pool.kill(self._sandbox)
        self._sandbox = None

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        who = self._resolve_user(user)
        result = await self.sandbox.run(
            command, cwd=cwd or self.task_env_config.workdir or self._workdir,
            envs=self._merge_env(env), timeout=timeout_sec or None,
            user=_user_name(who) if who is not None else self._image_user or DEFAULT_USER)
        return ExecResult(stdout=result.stdout, stderr=result.stderr,
                          return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        await self.sandbox.write_file(target_path, source.read_bytes(), user="root")
        mode = stat.S_IMODE(source.stat().st_mode)  # the file API writes 0644
        await self.sandbox.run(f"chmod {mode:o} {shlex.quote(target_path)}", user="root",
                               check=True)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"source directory {source} does not exist")
        await upload_tree(self.sandbox, source, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.sandbox.read_bytes(source_path, user="root")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await download_tree(self.sandbox, source_dir, Path(target_dir))


class AenvJobPlugin(BaseJobPlugin):
    """``--plugin aenv.integrations.harbor:AenvJobPlugin``: at the job's end, close the pools:
    the prepared parents, everything labelled with a pool, and anything else of the run.
    Without it they die at the process's exit (the client's ``atexit``) or by their timeout."""

    async def on_job_start(self, job: Any) -> None:
        return None

    async def on_job_end(self, job_result: Any) -> None:
        await close_pools()
        log.info("aenv: the job's sandboxes are killed")


def _user_name(user: str | int) -> str:
    """envd takes user names: uid 0 is ``root``; another uid is passed as its digits."""
    return "root" if user in (0, "0") else str(user)


def _dockerfile_user(dockerfile: Path) -> str | None:
    """The last stage's ``USER`` (name or uid, without a group), None when it sets none."""
    user: str | None = None
    for line in dockerfile.read_text(errors="replace").splitlines():
        words = line.strip().split()
        if not words:
            continue
        if words[0].upper() == "FROM":
            user = None
        elif words[0].upper() == "USER" and len(words) > 1:
            user = words[1].split(":")[0]
    return user
