"""process.Process through the official async SDK."""

from __future__ import annotations

import pytest
from e2b import AsyncSandbox, CommandExitException, NotFoundException

pytestmark = pytest.mark.anyio


async def test_run(async_sandbox: AsyncSandbox) -> None:
    result = await async_sandbox.commands.run("echo hi; echo there >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "there\n", 0)


async def test_exit_code(async_sandbox: AsyncSandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        await async_sandbox.commands.run("exit 7")
    assert info.value.exit_code == 7


async def test_background_list_kill(async_sandbox: AsyncSandbox) -> None:
    handle = await async_sandbox.commands.run("sleep 30", background=True)
    assert handle.pid in {p.pid for p in await async_sandbox.commands.list()}
    assert await handle.kill() is True
    with pytest.raises(CommandExitException):
        await handle.wait()


async def test_stream_input_handle(async_sandbox: AsyncSandbox) -> None:
    handle = await async_sandbox.commands.run("cat", background=True, stdin=True)
    async with async_sandbox.commands.stream_input(handle.pid) as stream:
        for i in range(20):
            await stream.send(f"{i} ")
    await async_sandbox.commands.close_stdin(handle.pid)
    result = await handle.wait()
    assert result.stdout == "".join(f"{i} " for i in range(20))


async def test_on_stdout_callback(async_sandbox: AsyncSandbox) -> None:
    seen: list[str] = []
    await async_sandbox.commands.run("echo a; sleep 0.05; echo b", on_stdout=seen.append)
    assert "".join(seen) == "a\nb\n"


async def test_connect(async_sandbox: AsyncSandbox) -> None:
    handle = await async_sandbox.commands.run("sleep 0.3; echo late", background=True)
    await handle.disconnect()
    again = await async_sandbox.commands.connect(handle.pid)
    assert (await again.wait()).stdout == "late\n"


async def test_connect_missing(async_sandbox: AsyncSandbox) -> None:
    with pytest.raises(NotFoundException):
        await async_sandbox.commands.connect(999_999)
