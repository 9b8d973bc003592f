"""Template builds as the E2B SDK's ``Template.build`` drives them (e2b-compat §2.4.10): ask
for a build, start it with its steps (or a Dockerfile), follow its status and logs.

A build is asked for first (``request_build``: the template is made or found by name, a
``waiting`` build recorded), then its files are uploaded (``template_files.py``), then it is
started (``start_build``), which hands a ``BuildPlan`` to the builder (``builder.py``); from
then on the builder alone moves the build on (``building`` → ``ready`` | ``error``). The tags
a request names are kept by the builder until the build starts: a restart in between fails
the waiting build anyway (``builder.recover``).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aenv.core.errors import AlreadyExists, Conflict, InvalidArgument
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.template_catalog import (
    building,
    check_tag,
    require_template,
    split_name,
)
from aenv.store.templates import DEFAULT_TAG, BuildRecord, LogEntry, TemplateRecord
from aenv.templates.dockerfile import plan_from_dockerfile
from aenv.templates.e2b_steps import check_files_hash, plan_from_e2b
from aenv.templates.plan import BuildPlan

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
LOG_LEVELS = ("debug", "info", "warn", "error")


def _check_name(name: str) -> str:
    if not _NAME.match(name) or name == "base":
        raise InvalidArgument(
            f"invalid template name {name!r} (1-128 of a-z 0-9 . _ -, starting with a letter or "
            "digit; 'base' is built in)")
    return name


@dataclass(frozen=True)
class Requested:
    template: TemplateRecord
    build: BuildRecord
    #: The tags the build will get when ready (the default tag if the request named none).
    tags: list[str]


async def request_build(node: Node, name: str, tags: Sequence[str], *, cpu_count: int | None,
                        memory_mb: int | None) -> Requested:
    """``POST /v3/templates``: a new ``waiting`` build of template ``name[:tag]``.

    Prerequisites: ``name`` is a valid name other than ``base``.
    On success: the template exists (made now, or found by name; its resources set to the
    request's or the node's defaults), a ``waiting`` build of it is recorded, and the tags
    asked for (``tags`` and the name's ``:tag``) are remembered for ``start_build``.
    On failure: ``InvalidArgument`` (name or tag); nothing recorded.
    Two requests making one name at once share the template (the loser finds the winner's).
    A crash between the template and its build leaves a template without builds, listed as
    ``waiting``; the client's retry adds the build to it.
    """
    store, builder = building(node)
    base, tag = split_name(name)
    _check_name(base)
    wanted = [check_tag(t) for t in [*tags, *([tag] if tag else [])]]
    now = time.time()
    cpu = cpu_count or node.settings.default_cpu_count
    memory = memory_mb or node.settings.default_memory_mb
    record = await store.get_template(base)
    if record is None:
        fresh = TemplateRecord(
            template_id="".join(secrets.choice(_ALPHABET) for _ in range(20)), name=base,
            created_at=now, updated_at=now, cpu_count=cpu, memory_mb=memory)
        try:
            await store.insert_template(fresh)
            record = fresh
        except AlreadyExists:
            record = await store.require_template(base)  # a concurrent request made it first
    if record.cpu_count != cpu or record.memory_mb != memory:
        record = await store.update_template(record, cpu_count=cpu, memory_mb=memory)
    build = BuildRecord(build_id=str(uuid.uuid4()), template_id=record.template_id,
                        status="waiting", created_at=now, updated_at=now, cpu_count=cpu,
                        memory_mb=memory)
    await store.insert_build(build)
    builder.requested_tags[build.build_id] = wanted
    return Requested(record, build, wanted or [DEFAULT_TAG])


@dataclass(frozen=True)
class BuildSource:
    """What a build is made of, as ``POST /v2/templates/{id}/builds/{build}`` says it: E2B's
    base and steps, or aenv's Dockerfile with the hash of its uploaded context."""

    from_image: str | None = None
    from_template: str | None = None
    #: E2B's ``fromImageRegistry`` (its ``type`` and credentials) as sent.
    registry: Mapping[str, Any] | None = None
    steps: Sequence[Mapping[str, Any]] = ()
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False
    dockerfile: str | None = None
    context_hash: str | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None
    #: Registry credentials for the base image (user, password).
    auth: tuple[str, str] | None = None


def _plan(source: BuildSource) -> tuple[BuildPlan, list[str]]:
    """The source as a plan, and the warnings of what a Dockerfile could not carry over."""
    if source.dockerfile is None:
        return plan_from_e2b(
            from_image=source.from_image, from_template=source.from_template,
            registry=source.registry, steps=source.steps, start_cmd=source.start_cmd,
            ready_cmd=source.ready_cmd, force=source.force), []
    if not source.context_hash:
        raise InvalidArgument("a Dockerfile build needs the contextHash of its upload")
    check_files_hash(source.context_hash)
    plan, warnings = plan_from_dockerfile(
        source.dockerfile, context_hash=source.context_hash, build_args=source.build_args,
        target=source.target)
    return (replace(plan, force=True) if source.force else plan), warnings


def _missing_upload(plan: BuildPlan, files_dir: Path) -> str | None:
    """The first COPY whose files were not uploaded, as the error names it (stats files: run
    in a thread)."""
    for stage in plan.stages:
        for step in stage.steps:
            if step.files_hash and not (files_dir / step.files_hash).is_file():
                return f"the files of COPY {step.args[0]} (hash {step.files_hash}) were not " \
                       "uploaded"
    return None


async def start_build(node: Node, template_id: str, build_id: str, source: BuildSource
                      ) -> None:
    """Start a requested build in the background.

    Prerequisites: the build exists, is ``waiting`` and was not started; every COPY's files
    were uploaded (``template_files.receive_files``).
    On success: the plan is valid, a Dockerfile's warnings are in the build's log, and the
    builder runs it with the tags ``request_build`` remembered; its status tells the rest.
    On failure: ``NotFound`` (template or build), ``Conflict`` (already started),
    ``InvalidArgument`` (the plan, or files not uploaded); the build
    stays ``waiting`` and may be started again.
    A crash once the builder has it leaves the build ``waiting`` or ``building``, which the
    next start marks ``error`` (``builder.recover``).
    """
    store, builder = building(node)
    record = await require_template(store, template_id)
    build = await store.require_build(record.template_id, build_id)
    if build.status != "waiting" or builder.running(build_id):
        raise Conflict(f"build {build_id} was already started")
    plan, warnings = _plan(source)
    missing = await asyncio.to_thread(_missing_upload, plan, builder.files_dir)
    if missing is not None:
        raise InvalidArgument(missing)
    for warning in warnings:
        await store.append_log(build_id, "warn", warning, "base")
    builder.start(record, build, plan, tags=builder.requested_tags.pop(build_id, []),
                  auth=source.auth)


@dataclass(frozen=True)
class BuildProgress:
    template: TemplateRecord
    build: BuildRecord
    #: One page of the build's log, from the offset asked for.
    entries: list[LogEntry]


async def build_status(node: Node, template_id: str, build_id: str, *, offset: int = 0,
                       limit: int = 100, level: str | None = None) -> BuildProgress:
    """A build's status and one page of its log.

    Prerequisites: the build exists; ``level`` is one of ``LOG_LEVELS`` or None (all).
    On success: the build as it is now and up to ``limit`` log lines numbered from
    ``offset`` (a line's number never changes, so polling never misses or repeats one).
    On failure: ``NotFound``, ``InvalidArgument`` (level). Reads only.
    """
    store, _ = building(node)
    record = await require_template(store, template_id)
    build = await store.require_build(record.template_id, build_id)
    if level is not None and level not in LOG_LEVELS:
        raise InvalidArgument("level must be debug, info, warn or error")
    entries = await store.logs(build_id, offset=offset, limit=limit, level=level)
    return BuildProgress(record, build, entries)
