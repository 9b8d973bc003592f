"""aenv's own: how the node's background loops are doing (``orchestrator/supervisor.py``),
and what its pools hold ahead of demand."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from aenv.api.auth import require_operator
from aenv.api.node import NodeDep

router = APIRouter(dependencies=[Depends(require_operator)])


class LoopOut(BaseModel):
    name: str
    state: Literal["running", "backing-off", "done", "stopped"]
    failures: int
    in_a_row: int = Field(serialization_alias="inARow")
    last_error: str | None = Field(serialization_alias="lastError")
    failed_at: float | None = Field(serialization_alias="failedAt")
    retry_at: float | None = Field(serialization_alias="retryAt")


class LoopsOut(BaseModel):
    loops: list[LoopOut]
    #: False while any loop is backing off after a failure.
    healthy: bool


@router.get("/node/loops", response_model=LoopsOut, response_model_by_alias=True)
async def node_loops(node: NodeDep) -> LoopsOut:
    loops = [LoopOut(name=h.name, state=h.state, failures=h.failures, in_a_row=h.in_a_row,
                     last_error=h.last_error, failed_at=h.failed_at, retry_at=h.retry_at)
             for h in node.supervisor.health()]
    return LoopsOut(loops=loops, healthy=all(loop.state != "backing-off" for loop in loops))


class PoolsOut(BaseModel):
    #: Network slots made ahead, not yet given to a sandbox.
    network_slots: int = Field(serialization_alias="networkSlots")
    #: Booted sandboxes of the default template waiting to be claimed (each holds a slot).
    warm: int
    #: Sandboxes created ahead for restores (each holds a slot).
    precreated: int
    #: Sandboxes being made for the warm or pre-created pool now (each holds a slot).
    making: int
    #: Paused sandboxes whose runtime sandbox is made ahead for their resume (each holds a
    #: slot; ``resume_ready_size``).
    resume_ready: int = Field(serialization_alias="resumeReady")


@router.get("/node/pools", response_model=PoolsOut, response_model_by_alias=True)
async def node_pools(node: NodeDep) -> PoolsOut:
    return PoolsOut(network_slots=node.pool.ready_count, warm=node.warm.ready,
                    precreated=node.precreated.ready,
                    making=node.warm.making + node.precreated.making,
                    resume_ready=node.resume_ready.ready)
