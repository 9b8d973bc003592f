"""The urpc client against a Unix socket server that answers as runsc's control socket does
(one JSON object back per request, no framing), and against the ways it can fail."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aenv.core.errors import NotFound
from aenv.runtime import urpc

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Serve = Callable[[Handler], Awaitable[Path]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    servers: list[asyncio.AbstractServer] = []

    async def start(handler: Handler) -> Path:
        path = tmp_path / f"runsc-{len(servers)}.sock"
        servers.append(await asyncio.start_unix_server(handler, str(path)))
        return path

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _request(reader: asyncio.StreamReader) -> dict[str, object]:
    decoder = json.JSONDecoder()
    data = b""
    while True:
        data += await reader.read(4096)
        try:
            return decoder.raw_decode(data.decode())[0]  # type: ignore[no-any-return]
        except ValueError:
            continue


async def test_a_call_sends_method_and_arg_and_returns_the_result(serve: Serve) -> None:
    seen: list[dict[str, object]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _request(reader))
        reply = json.dumps({"success": True, "err": "", "result": {"pid": 7}}).encode()
        for i in range(0, len(reply), 5):  # in pieces: the client must not need framing
            writer.write(reply[i:i + 5])
            await writer.drain()
        writer.close()

    path = await serve(handler)
    assert await urpc.call(path, "containerManager.WaitPID", {"PID": 7}) == {"pid": 7}
    assert seen == [{"method": "containerManager.WaitPID", "arg": {"PID": 7}}]


async def test_a_refusal_is_call_failed(serve: Serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b'{"success":false,"err":"Invalid stopCount: -1","result":null}')
        writer.close()

    path = await serve(handler)
    with pytest.raises(urpc.CallFailed, match="Invalid stopCount"):
        await urpc.call(path, "containerManager.Resume")


async def test_no_answer_is_in_doubt(serve: Serve) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b'{"success":tr')  # then the sandbox dies
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        await asyncio.sleep(5)

    with pytest.raises(urpc.CallInDoubt):
        await urpc.call(await serve(hang_up), "containerManager.Pause")
    with pytest.raises(urpc.CallInDoubt):
        await urpc.call(await serve(silent), "containerManager.Pause", timeout=0.2)


async def test_no_socket_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        await urpc.call(tmp_path / "runsc-gone.sock", "containerManager.Pause")


async def test_files_go_as_descriptors_with_the_request(tmp_path: Path) -> None:
    """A checkpoint's image files travel as SCM_RIGHTS with the request's first bytes; the
    sandbox writes into them."""
    import socket
    import threading

    path = tmp_path / "runsc-fds.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    got: dict[str, object] = {}

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 4)
            got["request"] = json.loads(data)
            for n, fd in enumerate(fds):
                with open(fd, "w") as fh:
                    fh.write(f"file {n}")
            conn.sendall(b'{"success":true,"err":"","result":{}}')

    thread = threading.Thread(target=answer)
    thread.start()
    targets = [tmp_path / f"f{n}" for n in range(3)]
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(open(t, "w")) for t in targets]
        result = await urpc.call(path, "containerManager.Checkpoint", {"Resume": True},
                                 files=[f.fileno() for f in opened])
    thread.join(5)
    listener.close()
    assert result == {}
    assert got["request"] == {"method": "containerManager.Checkpoint", "arg": {"Resume": True}}
    assert [t.read_text() for t in targets] == ["file 0", "file 1", "file 2"]
