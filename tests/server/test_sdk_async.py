"""The node server through the official async Python SDK."""

from __future__ import annotations

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize

from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]


async def test_async_lifecycle(server: NodeServer) -> None:
    sbx = await AsyncSandbox.create(timeout=60, metadata={"kind": "async"})
    try:
        assert (await sbx.commands.run("echo async")).stdout == "async\n"
        with pytest.raises(CommandExitException):
            await sbx.commands.run("false")
        await sbx.files.write("a.txt", "x")
        assert await sbx.files.read("a.txt") == "x"
        chunks: list[bytes] = []
        pty = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=chunks.append)
        await sbx.pty.send_stdin(pty.pid, b"echo in-pty\nexit\n")
        await pty.wait()
        assert b"in-pty" in b"".join(chunks)
        info = await sbx.get_info()
        assert info.metadata == {"kind": "async"}
        assert await sbx.is_running()
    finally:
        assert await sbx.kill() is True
    assert await sbx.is_running() is False
