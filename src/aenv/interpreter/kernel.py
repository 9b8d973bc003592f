"""One Jupyter kernel: start it, run code on it as a stream of output lines, interrupt,
restart, stop.

Owns the kernel process (through jupyter_client's AsyncKernelManager) and the client channels
to it, and nothing else: which language or context it serves is the caller's. One execution
at a time: `execute` takes the kernel's lock inside a task the kernel owns (not the request),
so an execution whose client went away is still driven to its end — interrupted, drained,
its env vars restored — before the next one starts. A kernel that ignores the interrupt past
`INTERRUPT_GRACE_S` is restarted: its state is lost, but the context stays usable.

Nothing here times out on a clock the sandbox's pause can stop: no heartbeat channel and no
jupyter_client restarter, so a sandbox resumed after a long pause finds its kernels as it left
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
from pathlib import Path
from typing import Any

from jupyter_client.client import KernelClient
from jupyter_client.manager import AsyncKernelManager

from aenv.interpreter import envvars, results
from aenv.interpreter.execution import Execution

log = logging.getLogger(__name__)

#: A kernel that answers no kernel_info within this long after its start failed to start
#: (ipykernel with numpy's import takes ~2 s on a loaded 2-core machine; deno ~1 s).
START_TIMEOUT_S = 60.0
#: Seconds without output after which a stream carries a keepalive line: writing is how the
#: server learns that a client behind a proxy went away (see streaming.py).
KEEPALIVE_S = 5.0
#: How often a running execution checks that its kernel is still alive.
POLL_S = 1.0
#: How often an abandoned execution checks whether its kernel went idle or died.
ABANDONED_POLL_S = 0.25
#: After an interrupt, how long the interrupted cell gets to end before the kernel is restarted.
INTERRUPT_GRACE_S = 10.0
#: How long a silent helper snippet (env vars) may run.
SNIPPET_TIMEOUT_S = 30.0
#: How long the shell reply may trail the kernel's idle status on iopub.
REPLY_TIMEOUT_S = 10.0
#: Deno's kernel publishes a cell's last stream and execute_result *after* its idle status;
#: for it, the end of a cell is idle, the reply, then this long without a message.
LATE_OUTPUT_S = {"deno": 0.2}
STARTUP_FILE = Path(__file__).with_name("ipython_startup.py")


class KernelError(RuntimeError):
    """The kernel could not be started or restarted (HTTP 500)."""


class Kernel:
    """A kernel of one kernelspec, started in ``cwd`` with ``env`` added to the server's own."""

    def __init__(self, kernelspec: str, language: str, cwd: str, env: dict[str, str]) -> None:
        self.kernelspec = kernelspec
        self.language = language
        self.cwd = cwd
        self.env = env
        self._manager = AsyncKernelManager(kernel_name=kernelspec)
        # jupyter_client's restarter would restart a kernel it judges dead; a paused sandbox
        # must not come back to restarted kernels. AsyncKernelManager has no restarter loop,
        # and this keeps it so should one be configured.
        self._manager.autorestart = False
        self._client: KernelClient | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._generation = 0  # counts restarts: a restarted kernel has nothing to restore

    async def start(self) -> None:
        extra: list[str] = []
        env = {**os.environ, **self.env}
        if self.language == "python":
            extra.append(f"--IPKernelApp.exec_files={STARTUP_FILE}")
        if self.kernelspec == "deno":
            # Deno colours the text/plain of results (ANSI codes in `execution.text`) unless
            # told not to; other kernels send plain text.
            env.setdefault("NO_COLOR", "1")
        try:
            await self._manager.start_kernel(cwd=self.cwd, env=env, extra_arguments=extra)
            await self._connect()
        except Exception as exc:
            await self._kill_quietly()
            raise KernelError(f"{self.kernelspec} kernel failed to start: {exc}") from exc

    async def _connect(self) -> None:
        if self._client is not None:
            self._client.stop_channels()
        client = self._manager.client()
        # No heartbeat (see the module docstring) and no stdin: input() is not supported.
        client.start_channels(hb=False, stdin=False)
        self._client = client
        await client.wait_for_ready(timeout=START_TIMEOUT_S)

    async def _kill_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self._manager.shutdown_kernel(now=True)

    @property
    def client(self) -> KernelClient:
        assert self._client is not None, "kernel not started"
        return self._client

    async def stop(self) -> None:
        """Shut the kernel down (it is asked first, then killed)."""
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            self._client.stop_channels()
            self._client = None
        await self._kill_quietly()

    async def restart(self) -> None:
        """A fresh kernel process, same kernelspec, cwd and env; every variable is gone.
        Waits for a running execution to end first."""
        async with self._lock:
            await self._restart_locked()

    async def _restart_locked(self) -> None:
        self._generation += 1
        try:
            await self._manager.restart_kernel(now=True)
            await self._connect()
        except Exception as exc:
            raise KernelError(f"{self.kernelspec} kernel failed to restart: {exc}") from exc

    def interrupt_soon(self) -> None:
        self._spawn(self._manager.interrupt_kernel())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        # Tasks the kernel owns: kept referenced until done, cancelled by stop().
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def is_alive(self) -> bool:
        return bool(await self._manager.is_alive())

    def execute(self, code: str, env: dict[str, str]) -> Execution:
        """Start running ``code`` (after any execution already queued on this kernel)."""
        execution = Execution(self.interrupt_soon)
        execution.task = self._spawn(self._run(execution, code, env))
        return execution

    async def _run(self, execution: Execution, code: str, env: dict[str, str]) -> None:
        try:
            async with self._lock:
                await self._run_locked(execution, code, env)
        except Exception as exc:
            log.exception("execution failed")
            execution.emit(results.synthetic_error(type(exc).__name__, str(exc)))
        finally:
            execution.close()

    async def _run_locked(self, execution: Execution, code: str, env: dict[str, str]) -> None:
        if execution.abandoned:
            return  # the client left while this waited for the kernel
        setup = envvars.set_code(self.language, env)
        if setup:
            await self._silent(setup)
        generation = self._generation
        try:
            await self._drive(execution, code)
        finally:
            restore = envvars.restore_code(self.language, env)
            if restore and generation == self._generation:
                await self._silent(restore)
        execution.emit(results.END_OF_EXECUTION)

    async def _drive(self, execution: Execution, code: str) -> None:
        if execution.abandoned:
            return
        msg_id = self.client.execute(code, silent=False, store_history=True,
                                     allow_stdin=False, stop_on_error=False)
        execution.running = True
        try:
            await self._follow(execution, msg_id)
        finally:
            execution.running = False

    async def _follow(self, execution: Execution, msg_id: str) -> None:
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        last_line = loop.time()
        while True:
            if execution.abandoned and deadline is None:
                deadline = loop.time() + INTERRUPT_GRACE_S
            if deadline is not None and loop.time() > deadline:
                log.warning("%s kernel ignored an interrupt; restarting it", self.kernelspec)
                await self._restart_locked()
                return
            # Once abandoned, look often: the interrupted cell (or a kernel that died of the
            # interrupt: one whose kernelspec asks for SIGINT and has no handler) should free
            # the context at once.
            poll = ABANDONED_POLL_S if execution.abandoned else POLL_S
            try:
                msg = await self.client.get_iopub_msg(timeout=poll)
            except queue.Empty:
                if not await self.is_alive():
                    log.warning("%s kernel died during an execution; restarting it",
                                self.kernelspec)
                    execution.emit(results.synthetic_error(
                        "KernelDied", "the kernel died during the execution and was restarted"))
                    await self._restart_locked()
                    return
                if loop.time() - last_line >= KEEPALIVE_S:
                    execution.emit(results.KEEPALIVE)
                    last_line = loop.time()
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # a helper snippet's or an interrupted cell's leftovers
            last_line = loop.time()
            if execution.on_iopub(msg):
                break
        reply = await self._reply(msg_id)
        if reply is not None:
            execution.on_reply(reply)
        settle = LATE_OUTPUT_S.get(self.kernelspec)
        while settle:
            try:
                msg = await self.client.get_iopub_msg(timeout=settle)
            except queue.Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                execution.on_iopub(msg)

    async def _reply(self, msg_id: str) -> dict[str, Any] | None:
        """The shell reply to ``msg_id``; replies to earlier requests are dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLY_TIMEOUT_S
        while (left := deadline - loop.time()) > 0:
            try:
                msg: dict[str, Any] = await self.client.get_shell_msg(timeout=left)
            except queue.Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg
        log.warning("no execute_reply for %s within %.0f s", msg_id, REPLY_TIMEOUT_S)
        return None

    async def _silent(self, code: str) -> None:
        """Run a helper snippet that adds nothing to the history or the execution count."""
        msg_id = self.client.execute(code, silent=True, store_history=False,
                                     allow_stdin=False, stop_on_error=False)
        async with asyncio.timeout(SNIPPET_TIMEOUT_S):
            while True:
                msg = await self.client.get_iopub_msg()
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "error":
                    log.warning("helper snippet failed: %s", msg["content"].get("evalue"))
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        await self._reply(msg_id)
