"""What a template build does, independent of how it was asked for.

Both front ends translate into a :class:`BuildPlan`: the E2B template-build API
(``POST /v2/templates/{id}/builds/{buildID}`` steps, ``api/templates.py``) and Dockerfiles
(``templates/dockerfile.py``, multi-stage). The builder (``orchestrator/ops/build.py``) executes
a plan; it never sees a request body or a Dockerfile.

A plan is a list of stages. The last stage is the template; earlier stages exist only to be
copied from (``COPY --from=<stage>``). A stage starts from an OCI image, an existing template,
or an earlier stage, then applies steps in order:

* ``RUN``     ``args = (command, [user])``: ``/bin/sh -c command`` in a build sandbox,
              as ``user`` (else the stage's current user), in the current workdir and env.
* ``COPY``    ``args = (src, dest, [owner], [mode])``: ``src`` (a path or glob) from the
              uploaded file archive ``files_hash`` (E2B: one archive per COPY; Dockerfile:
              the whole build context), or from the filesystem of stage ``from_stage``.
              ``owner`` is ``user[:group]``; ``mode`` an octal string such as ``"0755"``.
* ``ENV``     ``args = (key1, value1, key2, value2, ...)``.
* ``WORKDIR`` ``args = (path,)``: relative paths resolve against the current workdir.
* ``USER``    ``args = (user,)``: a name or ``uid[:gid]``.

Nothing here touches the disk or the network: these are frozen values, checked on creation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aenv.core.errors import InvalidArgument

StepKind = Literal["COPY", "ENV", "RUN", "WORKDIR", "USER"]
STEP_KINDS: tuple[StepKind, ...] = ("COPY", "ENV", "RUN", "WORKDIR", "USER")

#: The SDK's default base image (``Template().from_base_image()``); served by the node's
#: built-in ``base`` template, since no outside registry is reachable from a node.
E2B_BASE_IMAGE = "e2bdev/base"


@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for one pull (E2B ``fromImageRegistry`` of type ``registry``)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class FromImage:
    """Start from an OCI image: ``docker://`` reference (``host/repo:tag``, ``repo@sha256:…``),
    ``oci:<dir>[:<tag>]`` or ``docker-archive:<file>``."""

    reference: str
    auth: RegistryAuth | None = None


@dataclass(frozen=True)
class FromTemplate:
    """Start from an existing template of this node (id, name or alias)."""

    template: str


@dataclass(frozen=True)
class FromStage:
    """Start from an earlier stage of the same plan (its index in :attr:`BuildPlan.stages`)."""

    stage: int


Base = FromImage | FromTemplate | FromStage


@dataclass(frozen=True)
class Step:
    kind: StepKind
    args: tuple[str, ...]
    #: Re-run this step even if its result is cached (E2B ``force``; SDK ``skip_cache``).
    force: bool = False
    #: COPY: the uploaded archive (E2B ``filesHash``) its sources come from.
    files_hash: str | None = None
    #: COPY: the stage (index) its sources come from instead of an archive.
    from_stage: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise InvalidArgument(f"unknown step type {self.kind!r}")
        if any(not isinstance(a, str) for a in self.args):
            raise InvalidArgument(f"{self.kind} arguments must be strings")
        if self.kind == "RUN" and not 1 <= len(self.args) <= 2:
            raise InvalidArgument("RUN takes a command and an optional user")
        if self.kind == "RUN" and not self.args[0].strip():
            raise InvalidArgument("RUN needs a command")
        if self.kind == "COPY":
            if not 2 <= len(self.args) <= 4 or not self.args[0] or not self.args[1]:
                raise InvalidArgument("COPY takes a source, a destination, [owner], [mode]")
            if (self.files_hash is None) == (self.from_stage is None):
                raise InvalidArgument("COPY needs exactly one of filesHash or a source stage")
            if len(self.args) == 4 and self.args[3]:
                try:
                    mode = int(self.args[3], 8)
                except ValueError:
                    raise InvalidArgument(f"COPY mode {self.args[3]!r} is not octal") from None
                if not 0 <= mode <= 0o7777:
                    raise InvalidArgument(f"COPY mode {self.args[3]!r} is out of range")
        if self.kind == "ENV" and (not self.args or len(self.args) % 2):
            raise InvalidArgument("ENV takes key/value pairs")
        if self.kind == "ENV" and any(
            not k or "=" in k or "\0" in k for k in self.args[0::2]
        ):
            raise InvalidArgument("ENV keys must be non-empty and contain no '='")
        if self.kind in ("WORKDIR", "USER") and (len(self.args) != 1 or not self.args[0]):
            raise InvalidArgument(f"{self.kind} takes exactly one non-empty argument")


@dataclass(frozen=True)
class Stage:
    base: Base
    steps: tuple[Step, ...] = ()
    #: Dockerfile ``FROM … AS name`` (informational; references are by index).
    name: str | None = None


@dataclass(frozen=True)
class BuildPlan:
    stages: tuple[Stage, ...]
    #: Started in the background in every sandbox of the template (before its memory image).
    start_cmd: str | None = None
    #: Polled until it exits 0, then the memory image is taken.
    ready_cmd: str | None = None
    #: Rebuild everything, ignoring cached steps (E2B ``force``).
    force: bool = False

    def __post_init__(self) -> None:
        if not self.stages:
            raise InvalidArgument("a build needs at least one stage")
        for index, stage in enumerate(self.stages):
            refs = [s.from_stage for s in stage.steps if s.from_stage is not None]
            if isinstance(stage.base, FromStage):
                refs.append(stage.base.stage)
            for ref in refs:
                if not 0 <= ref < index:
                    raise InvalidArgument(
                        f"stage {index} refers to stage {ref}, which does not come before it"
                    )

    @property
    def final(self) -> Stage:
        return self.stages[-1]
