"""Build a template: execute a ``BuildPlan`` stage by stage, then take its memory image.

Prerequisites: the plan is valid (``templates/plan.py`` checks it); every COPY's files were
uploaded (``<build_dir>/files/<filesHash>``); the node has the template's CPU and memory free
for one build sandbox at a time.

On success: every RUN, COPY and WORKDIR step is one read-only layer, named by the hash of
everything that defines it (its parent's chain, the step, the env, user and workdir it runs
with, the uploaded files' hash), so a rebuild re-runs from the first changed step and reuses
every layer below it; ENV and USER are metadata only. Then a sandbox of the final stage is
started, ``start_cmd`` launched in the background, ``ready_cmd`` polled until it exits 0,
and the sandbox is checkpointed: the committed repository snapshot (kind ``template``) is
what every create of the template restores, start command included.

On failure: ``BuildFailed`` naming the step (E2B's step names: ``base``, ``1``…``N`` for the
final stage's steps, ``finalize``; ``<stage>.<n>`` inside earlier stages) and why (a RUN's
exit code, a missing COPY source, an unknown user, a pull error, a ready command that never
succeeded). Layers of the steps that succeeded stay (the next build reuses them); nothing
half-made is visible: a layer appears by rename, the snapshot by one commit.

A crash mid-build leaves a build sandbox no record names (recovery destroys it), staging
directories (swept at start) and a build the builder marks ``error`` at start.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import time
from collections.abc import Sequence

from aenv.core.errors import AenvError, DeadlineExceeded, InvalidArgument
from aenv.orchestrator.build_image import finalize
from aenv.orchestrator.build_layers import check_user, copy_layer, workdir_layer
from aenv.orchestrator.build_log import BuildLog
from aenv.orchestrator.build_sandbox import RunStep, StepFailed, run_step
from aenv.orchestrator.build_state import (
    BASE_STEP,
    FINALIZE_STEP,
    BuildFailed,
    BuildSpec,
    StageState,
    chain_key,
    user_name,
)
from aenv.orchestrator.context import Node
from aenv.storage.image_files import join_workdir
from aenv.storage.image_reference import parse_reference
from aenv.storage.layers import LayerStore
from aenv.storage.repository import Snapshot
from aenv.templates.plan import (
    E2B_BASE_IMAGE,
    BuildPlan,
    FromImage,
    FromStage,
    FromTemplate,
    Stage,
    Step,
)

__all__ = ["BuildFailed", "BuildSpec", "execute"]

log = logging.getLogger("aenv.orchestrator.build")



def _step_name(stage_index: int, final: bool, number: int) -> str:
    return str(number) if final else f"{stage_index}.{number}"


async def execute(node: Node, plan: BuildPlan, spec: BuildSpec, log_: BuildLog,
                  *, auth: tuple[str, str] | None = None) -> Snapshot:
    """Run the plan (see the module docstring); returns the committed template snapshot."""
    layers = node.layers
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        states: list[StageState] = []
        for index, stage in enumerate(plan.stages):
            final = index == len(plan.stages) - 1
            base_step = BASE_STEP if final else f"{index}.0"
            try:
                state = await _base(node, stage, states, stack, log_, base_step,
                                    force=plan.force, auth=auth)
            except AenvError as exc:
                raise BuildFailed(exc.message, base_step) from exc
            forced = plan.force
            for number, step in enumerate(stage.steps, 1):
                name = _step_name(index, final, number)
                forced = forced or step.force
                try:
                    state = await _apply(node, layers, state, step, states, spec, log_, name,
                                         forced=forced)
                except BuildFailed:
                    raise
                except AenvError as exc:
                    raise BuildFailed(exc.message, name) from exc
            states.append(state)
        try:
            snapshot = await finalize(node, states[-1], plan, spec, log_)
        except AenvError as exc:
            raise BuildFailed(exc.message, FINALIZE_STEP) from exc
    log_.info(f"template {spec.name} built in {time.monotonic() - started:.1f}s",
              FINALIZE_STEP)
    return snapshot


# -- bases ----------------------------------------------------------------------------------


def _is_e2b_base(reference: str) -> bool:
    """Whether ``reference`` names the SDK's default base image (any tag or digest)."""
    try:
        source = parse_reference(reference)
    except InvalidArgument:
        return False  # the pull reports it
    name = source.display.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.partition(':')[0]}"
    return source.transport == "docker" and name == f"docker.io/{E2B_BASE_IMAGE}"


async def _base(
    node: Node, stage: Stage, states: Sequence[StageState], stack: contextlib.AsyncExitStack,
    log_: BuildLog, step: str, *, force: bool, auth: tuple[str, str] | None,
) -> StageState:
    base = stage.base
    if isinstance(base, FromStage):
        log_.info(f"FROM stage {base.stage}", step)
        return states[base.stage].copy()
    if isinstance(base, FromTemplate) or (isinstance(base, FromImage)
                                          and _is_e2b_base(base.reference)):
        name = base.template if isinstance(base, FromTemplate) else "base"
        log_.info(f"FROM template {name}", step)
        template = await node.templates.resolve(name)
        return StageState(
            layers=list(template.layers), env=dict(template.env_vars),
            user=template.default_user, workdir=template.default_workdir,
            chain=chain_key("template", [p.name for p in template.layers],
                         template.env_vars, template.default_user, template.default_workdir),
        )
    log_.info(f"FROM {base.reference}", step)
    image = await stack.enter_async_context(node.images.image(
        base.reference, auth=(base.auth.username, base.auth.password) if base.auth else auth,
        refresh=force, on_progress=lambda message: log_.info(message, step)))
    env: dict[str, str] = {}
    for item in image.config.env:
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    log_.info(f"{image.reference}: {len(image.layers)} layers, "
              f"{image.size_bytes / 1e6:.1f} MB", step)
    return StageState(layers=list(image.layers), env=env, user=image.config.user,
                      workdir=image.config.workdir or None,
                      chain=chain_key("image", image.manifest_digest))


# -- steps ----------------------------------------------------------------------------------


async def _apply(
    node: Node, layers: LayerStore, state: StageState, step: Step,
    states: Sequence[StageState], spec: BuildSpec, log_: BuildLog, name: str, *, forced: bool,
) -> StageState:
    state = state.copy()
    args = list(step.args)
    if step.kind == "ENV":
        pairs: dict[str, str] = {}
        for key, value in zip(args[0::2], args[1::2], strict=True):
            # As Docker: ``ENV PATH=/x:$PATH`` sees the environment so far (this step's
            # earlier pairs included); names never set stay as written.
            known = {**state.env, **pairs}
            pairs[key] = expand_env(value, known)
        log_.info("ENV " + " ".join(f"{k}={v}" for k, v in pairs.items()), name)
        state.env.update(pairs)
        state.chain = chain_key(state.chain, "ENV", pairs)
        return state
    if step.kind == "USER":
        log_.info(f"USER {args[0]}", name)
        state.user = args[0]
        state.chain = chain_key(state.chain, "USER", args[0])
        return state
    if step.kind == "WORKDIR":
        path = join_workdir(state.workdir, args[0])
        log_.info(f"WORKDIR {path}", name)
        state.workdir = path
        chain = chain_key(state.chain, "WORKDIR", path, state.user)
        state.chain = chain
        layer = await workdir_layer(layers, state, path, chain, spec)
        if layer is not None:
            state.layers.append(layer)
        return state
    if step.kind == "RUN":
        user = args[1] if len(args) > 1 and args[1] else (state.user or "root")
        key = chain_key(state.chain, "RUN", args[0], user, state.env, state.workdir)
        log_.info(f"RUN {args[0]}" + (f" (as {user})" if len(args) > 1 else ""), name)
        chain, cached = await _step_layer(node, layers, key, forced=forced)
        if cached:
            log_.info("CACHED", name)
        else:
            await check_user(state, user, spec)
            started = time.monotonic()
            try:
                await run_step(
                    node, layers, state.layers,
                    RunStep(command=args[0], user=user_name(user), workdir=state.workdir,
                            env=state.env, cpu_count=spec.cpu_count, memory_mb=spec.memory_mb,
                            timeout_s=spec.step_timeout_s),
                    layer_id=chain, on_output=lambda stream, text: log_.output(name, stream, text),
                )
            except StepFailed as exc:
                log_.end_output(name)
                raise BuildFailed(
                    f"step {name} (RUN {args[0][:200]}) failed: exit code {exc.exit_code}",
                    name) from exc
            except DeadlineExceeded as exc:
                log_.end_output(name)
                raise BuildFailed(f"step {name} (RUN {args[0][:200]}) timed out after "
                                  f"{spec.step_timeout_s:.0f}s", name) from exc
            log_.end_output(name)
            log_.info(f"done in {time.monotonic() - started:.1f}s", name)
            await _remember(node, key, chain)
        state.layers.append(layers.path(chain))
        state.chain = chain
        return state
    # COPY
    source: object
    if step.from_stage is not None:
        source = ("stage", states[step.from_stage].chain)
    else:
        source = ("files", step.files_hash)
    key = chain_key(state.chain, "COPY", args, source, state.user, state.workdir)
    log_.info(f"COPY {' '.join(a for a in args if a)}", name)
    chain, cached = await _step_layer(node, layers, key, forced=forced)
    if cached:
        log_.info("CACHED", name)
    else:
        await copy_layer(layers, state, step, states, chain, spec)
        await _remember(node, key, chain)
    state.layers.append(layers.path(chain))
    state.chain = chain
    return state


async def _step_layer(node: Node, layers: LayerStore, key: str, *, forced: bool
                      ) -> tuple[str, bool]:
    """The layer id for a step with cache key ``key``, and whether it is built already.

    Unforced: the newest layer made for ``key`` (a forced build's, else ``key`` itself).
    Forced: a fresh id, so the rebuilt layer never replaces one other templates use; the
    chain then continues from that id, so later steps of this build rebuild too and the next
    unforced build finds the whole fresh tail (``_remember``).
    """
    if forced:
        return chain_key(key, secrets.token_hex(8)), False
    made = await node.template_store.cached_layer(key)
    for layer_id in (made, key):
        if layer_id and layers.has(layer_id):
            return layer_id, True
    return key, False


async def _remember(node: Node, key: str, layer_id: str) -> None:
    if layer_id != key:
        await node.template_store.set_cached_layer(key, layer_id)


def expand_env(value: str, env: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` in ``value`` replaced from ``env``; unknown names kept."""
    def replace_one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))
    return _VAR.sub(replace_one, value)


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


