"""Provide the built-in ``code-interpreter-v1`` template (``templates/code_interpreter.py``):
build it through the node's own template pipeline when it is missing or its recipe changed.

The build is an ordinary template build (the same request, upload and start an E2B SDK's
``Template.build`` makes), so its status and log are where every build's are and a restart
cutting it short is handled the way the builder handles any build. A build tagged with the
recipe's tag and ``ready`` means there is nothing to do; one of this recipe running (another
call, before a restart) is waited for, not duplicated.

Its inputs are fetched by the node first (``interpreter_inputs.py``).
``run_provision_loop`` is the node's background task (``settings.code_interpreter``): a
download or build that fails is tried again after ``RETRY_S`` (a registry that was briefly
unreachable), at most ``ATTEMPTS`` times; then the failure stays in the node's log (and the
build's), and creates of the template answer that it has no ready build.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from aenv.core.errors import AenvError
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.interpreter_inputs import upload_contexts
from aenv.orchestrator.ops.template_build import BuildSource, request_build, start_build
from aenv.orchestrator.ops.template_catalog import building
from aenv.store.templates import DEFAULT_TAG, BuildRecord
from aenv.templates import code_interpreter
from aenv.templates.code_interpreter import Recipe

log = logging.getLogger("aenv.orchestrator.interpreter_template")

ATTEMPTS = 3
RETRY_S = 60.0
#: How often a build under way is looked at.
POLL_S = 1.0


class ProvisionFailed(Exception):
    """The template's build ended in ``error`` (its log says why)."""


async def current(node: Node, recipe: Recipe) -> BuildRecord | None:
    """The newest build of ``recipe`` (tagged with its tag once ready; waiting or building
    before that), or None."""
    store, _ = building(node)
    record = await store.get_template(code_interpreter.NAME)
    if record is None:
        return None
    tagged = await store.tagged_build(record.template_id, recipe.tag)
    if tagged is not None:
        build = await store.get_build(record.template_id, tagged)
        if build is not None and build.status == "ready":
            return build
    running = await store.builds(record.template_id, ["waiting", "building"])
    return running[0] if running else None


async def provide(node: Node) -> BuildRecord:
    """Make sure a ready build of the current recipe exists; its record.

    On failure: ``ProvisionFailed`` when the build ends in ``error``; the downloads' errors
    (``interpreter_inputs``) and the template pipeline's when the build cannot be asked for
    or started.
    """
    contexts = await upload_contexts(node)
    recipe = code_interpreter.recipe(r_hash=contexts.r_hash, inputs_hash=contexts.inputs_hash,
                                     package_hash=contexts.package_hash)
    store, builder = building(node)
    build = await current(node, recipe)
    if build is None or (build.status == "waiting" and not builder.running(build.build_id)):
        log.info("building the %s template (recipe %s): a few minutes, once",
                 code_interpreter.NAME, recipe.tag)
        requested = await request_build(
            node, code_interpreter.NAME, [DEFAULT_TAG, recipe.tag],
            cpu_count=code_interpreter.CPU_COUNT, memory_mb=code_interpreter.MEMORY_MB)
        await start_build(node, requested.template.template_id, requested.build.build_id,
                          BuildSource(from_template="base", steps=recipe.steps,
                                      start_cmd=recipe.start_cmd, ready_cmd=recipe.ready_cmd))
        build = requested.build
    while build.status not in ("ready", "error"):
        await asyncio.sleep(POLL_S)
        found = await store.get_build(build.template_id, build.build_id)
        if found is None:
            raise ProvisionFailed(f"build {build.build_id} of {code_interpreter.NAME} vanished")
        build = found
    if build.status == "error":
        raise ProvisionFailed(f"build {build.build_id} of {code_interpreter.NAME} failed: "
                              f"{build.reason or 'see its log'}")
    return build


async def run_provision_loop(node: Node) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            build = await provide(node)
        except (ProvisionFailed, AenvError, httpx.HTTPError, OSError) as exc:
            # A download or a build step that failed: a registry briefly away, a full disk.
            log.error("the %s template: %s (attempt %d of %d)", code_interpreter.NAME,
                      getattr(exc, "message", None) or exc, attempt, ATTEMPTS)
            if attempt < ATTEMPTS:
                await asyncio.sleep(RETRY_S * attempt)
            continue
        log.info("the %s template is ready (build %s)", code_interpreter.NAME, build.build_id)
        return


