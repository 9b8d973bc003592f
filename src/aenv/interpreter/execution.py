"""One run of user code: the lines it produced, in order, and a way to abandon it.

Owns the queue between the task that drives a kernel (kernel.py) and the response that
writes the lines (streaming.py), and the translation of the cell's iopub messages into those
lines (results.py shapes each one). It knows nothing of HTTP, and of the kernel only how to
ask it for an interrupt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from aenv.interpreter import results
from aenv.interpreter.results import Line


class Execution:
    """The lines of one cell. ``interrupt`` is how abandoning it reaches the kernel."""

    def __init__(self, interrupt: Callable[[], None]) -> None:
        self._interrupt = interrupt
        self.lines: asyncio.Queue[Line | None] = asyncio.Queue()
        self.abandoned = False
        self.running = False  # the code was sent to the kernel and has not ended
        self.counted = False  # a number_of_executions line went out
        self.task: asyncio.Task[None] | None = None

    def emit(self, line: Line) -> None:
        # An abandoned execution still runs to its end, but nobody reads its lines.
        if not self.abandoned:
            self.lines.put_nowait(line)

    def close(self) -> None:
        self.lines.put_nowait(None)

    async def stream(self) -> AsyncIterator[Line]:
        """The lines until the execution ends."""
        while (line := await self.lines.get()) is not None:
            yield line

    def abandon(self) -> None:
        """The client went away: interrupt the cell; its task drains it and frees the kernel."""
        if self.abandoned:
            return
        self.abandoned = True
        if self.running:
            # Only a cell of its own: one still queued must not interrupt the one running.
            self._interrupt()

    def on_iopub(self, msg: dict[str, Any]) -> bool:
        """Turn one of this cell's iopub messages into lines; True once the kernel is idle."""
        kind = msg["msg_type"]
        content = msg["content"]
        if kind == "stream":
            self.emit(results.stream_line(msg))
        elif kind in ("execute_result", "display_data"):
            self.emit(results.result_line(dict(content.get("data", {})),
                                          is_main_result=kind == "execute_result"))
        elif kind == "error":
            self.emit(results.error_line(content))
        elif kind == "execute_input" and isinstance(content.get("execution_count"), int):
            self.counted = True
            self.emit(results.count_line(content["execution_count"]))
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False

    def on_reply(self, reply: dict[str, Any]) -> None:
        """The cell's execute_reply: its count if no execute_input carried one, and an abort."""
        content = reply["content"]
        count = content.get("execution_count")
        if not self.counted and isinstance(count, int):
            # Kernels that publish no execute_input still count their cells in the reply.
            self.counted = True
            self.emit(results.count_line(count))
        if content.get("status") == "aborted":
            self.emit(results.synthetic_error("ExecutionAborted", "execution was aborted"))
