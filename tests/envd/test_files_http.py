"""``GET/POST /files`` through the official SDK, plus raw HTTP for what the SDK never sends.

Covers every upload encoding the SDK picks (multipart for str/bytes, octet-stream for streams
and ``use_octet_stream``, gzip), several files in one request, metadata as xattrs, ownership and
mode of what is written, Range and Content-Disposition on downloads, signed URLs against a
second envd that has an access token, and bad input that must be a 4xx, never a 500.
"""

from __future__ import annotations

import gzip
import io
import os
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
)
from e2b.connection_config import ConnectionConfig
from e2b.sandbox.filesystem.filesystem import WriteEntry
from packaging.version import Version

from tests.conftest import free_port
from tests.envd.harness import USER_UID, EnvdSandbox, start_envd

TOKEN = "secret-envd-token"


@pytest.fixture
def http(envd: EnvdSandbox) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=envd.url, timeout=30) as client:
        yield client


# -- round trips through the SDK ----------------------------------------------------------------


def test_write_and_read_text(sandbox: Sandbox, workdir: str, envd: EnvdSandbox) -> None:
    info = sandbox.files.write(f"{workdir}/hello.txt", "héllo wörld\n")
    assert (info.path, info.name, info.type) == (f"{workdir}/hello.txt", "hello.txt", FileType.FILE)
    assert info.metadata is None
    assert sandbox.files.read(f"{workdir}/hello.txt") == "héllo wörld\n"
    st = envd.host_path(f"{workdir}/hello.txt").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (USER_UID, USER_UID, 0o644)


def test_write_bytes_and_read_all_formats(sandbox: Sandbox, workdir: str) -> None:
    data = bytes(range(256)) * 4096 + b"tail"  # > 1 MiB: crosses the server's chunking
    sandbox.files.write(f"{workdir}/bin", data)
    assert sandbox.files.read(f"{workdir}/bin", format="bytes") == data
    with sandbox.files.read(f"{workdir}/bin", format="stream") as stream:
        assert b"".join(stream) == data
    assert sandbox.files.read(f"{workdir}/bin", format="bytes", gzip=True) == data


def test_write_streams_use_octet_stream(sandbox: Sandbox, workdir: str) -> None:
    chunks = [os.urandom(300_000) for _ in range(5)]
    sandbox.files.write(f"{workdir}/iter.bin", iter(chunks))
    assert sandbox.files.read(f"{workdir}/iter.bin", format="bytes") == b"".join(chunks)
    sandbox.files.write(f"{workdir}/io.bin", io.BytesIO(b"file-like"))
    assert sandbox.files.read(f"{workdir}/io.bin") == "file-like"


def test_write_gzip_and_octet_stream(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/gz.txt", "compressed " * 1000, gzip=True)
    assert sandbox.files.read(f"{workdir}/gz.txt") == "compressed " * 1000
    sandbox.files.write(f"{workdir}/raw.txt", b"raw body", use_octet_stream=True)
    assert sandbox.files.read(f"{workdir}/raw.txt", gzip=True) == "raw body"


def test_write_files_at_once(sandbox: Sandbox, workdir: str) -> None:
    infos = sandbox.files.write_files([
        WriteEntry(path=f"{workdir}/one.txt", data="1"),
        WriteEntry(path=f"{workdir.removeprefix('/home/user/')}/sub/two.txt", data=b"2"),
        WriteEntry(path=f"{workdir}/three.txt", data=""),
    ])
    assert [i.path for i in infos] == [
        f"{workdir}/one.txt", f"{workdir}/sub/two.txt", f"{workdir}/three.txt",
    ]
    assert [sandbox.files.read(i.path) for i in infos] == ["1", "2", ""]


def test_overwrite_truncates(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/f", "a much longer first version")
    sandbox.files.write(f"{workdir}/f", "short")
    assert sandbox.files.read(f"{workdir}/f") == "short"


def test_write_relative_path_creates_parents(
    sandbox: Sandbox, workdir: str, envd: EnvdSandbox
) -> None:
    rel = workdir.removeprefix("/home/user/")
    info = sandbox.files.write(f"{rel}/new/dirs/file.txt", "x")
    assert info.path == f"{workdir}/new/dirs/file.txt"
    for sub in ("new", "new/dirs"):
        st = envd.host_path(f"{workdir}/{sub}").stat()
        assert (st.st_uid, st.st_mode & 0o777) == (USER_UID, 0o755)


def test_write_as_root(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/root.txt", "r", user="root")
    info = sandbox.files.get_info(f"{workdir}/root.txt")
    assert (info.owner, info.group, info.permissions) == ("root", "root", "-rw-r--r--")
    # Root's 0644 file is not the user's to overwrite (as with `echo > f` in their shell)...
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write(f"{workdir}/root.txt", "u")
    assert sandbox.files.read(f"{workdir}/root.txt") == "r"
    # ...while root, unrestricted, takes over an existing file it writes, as envd does.
    sandbox.files.write(f"{workdir}/user.txt", "u")
    sandbox.files.write(f"{workdir}/user.txt", "r", user="root")
    assert sandbox.files.get_info(f"{workdir}/user.txt").owner == "root"


# -- as the requesting user (issue 21, item 3) -------------------------------------------------


def test_read_as_user_is_their_permission(sandbox: Sandbox, workdir: str) -> None:
    secret = f"{workdir}/secret"
    sandbox.commands.run(f"echo s > {secret} && chmod 600 {secret}", user="root")
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.read(secret)
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.read("/root/.bashrc-or-anything")  # /root is 0700: not even a lookup
    assert sandbox.files.read(secret, user="root") == "s\n"


def test_write_as_user_cannot_climb_out(sandbox: Sandbox, envd: EnvdSandbox) -> None:
    name = f"escape-{uuid.uuid4().hex[:6]}"
    # Relative to the user's home: /root/<name>, a directory only root may write.
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write(f"../../root/{name}", "x")
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write(f"../../root/{name}/deeper/f", "x")
    assert not envd.host_path(f"/root/{name}").exists()
    sandbox.files.write(f"../../root/{name}", "x", user="root")
    assert envd.host_path(f"/root/{name}").read_text() == "x"


def test_write_as_user_through_a_symlink(sandbox: Sandbox, workdir: str, envd: EnvdSandbox) -> None:
    target = f"/tmp/target-{uuid.uuid4().hex[:6]}"
    sandbox.commands.run(f"echo original > {target}", user="root")  # root's, 0644
    sandbox.commands.run(f"ln -s {target} {workdir}/link")
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write(f"{workdir}/link", "overwritten")
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write(f"{workdir}/link", "overwritten", use_octet_stream=True)
    assert envd.host_path(target).read_text() == "original\n"


def test_raw_upload_as_user_is_403(sandbox: Sandbox, envd: EnvdSandbox) -> None:
    name = f"raw-{uuid.uuid4().hex[:6]}"
    response = httpx.post(
        f"{envd.url}/files", params={"path": f"/root/{name}", "username": "user"},
        files={"file": ("f", b"x")},
    )
    assert response.status_code == 403, response.text
    assert response.json()["code"] == 403
    assert not envd.host_path(f"/root/{name}").exists()
    response = httpx.get(f"{envd.url}/files", params={"path": f"/root/{name}", "username": "user"})
    assert response.status_code == 403, response.text


def test_signed_url_acts_as_its_user(secured_sdk: Sandbox, secured: EnvdSandbox) -> None:
    name = f"signed-{uuid.uuid4().hex[:6]}"
    url = secured_sdk.upload_url(f"/root/{name}", user="user")
    response = httpx.post(url, content=b"x", headers={"content-type": "application/octet-stream"})
    assert response.status_code == 403, response.text
    assert not secured.host_path(f"/root/{name}").exists()


def test_metadata_round_trip(sandbox: Sandbox, workdir: str) -> None:
    metadata = {"author": "mish", "purpose": "upload"}
    info = sandbox.files.write(f"{workdir}/m.txt", "x", metadata=metadata)
    assert info.metadata == metadata
    assert sandbox.files.get_info(f"{workdir}/m.txt").metadata == metadata
    assert sandbox.files.list(workdir)[0].metadata == metadata
    assert sandbox.files.rename(f"{workdir}/m.txt", f"{workdir}/n.txt").metadata == metadata
    # Each upload replaces the metadata; none clears it.
    sandbox.files.write(f"{workdir}/n.txt", "y", metadata={"Stage": "two"}, use_octet_stream=True)
    assert sandbox.files.get_info(f"{workdir}/n.txt").metadata == {"stage": "two"}
    assert sandbox.files.write(f"{workdir}/n.txt", "z").metadata is None
    assert sandbox.files.get_info(f"{workdir}/n.txt").metadata is None


def test_metadata_set_out_of_band(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/x.txt", "x")
    sandbox.commands.run(
        f"python3 -c \"import os; os.setxattr('{workdir}/x.txt', 'user.e2b.author', b'me')\""
    )
    assert sandbox.files.get_info(f"{workdir}/x.txt").metadata == {"author": "me"}


def test_read_missing_and_directory(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{workdir}/missing.txt")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(workdir)


def test_write_onto_directory_or_below_file(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/dir")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write(f"{workdir}/dir", "x")
    sandbox.files.write(f"{workdir}/file", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write(f"{workdir}/file/below.txt", "x")


def test_unknown_user(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(AuthenticationException):
        sandbox.files.write(f"{workdir}/x", "x", user="nobody-here")  # type: ignore[arg-type]
    with pytest.raises(AuthenticationException):
        sandbox.files.read(f"{workdir}/x", user="nobody-here")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_async_read_write(async_sandbox: AsyncSandbox, workdir: str) -> None:
    files = async_sandbox.files
    await files.write(f"{workdir}/a.txt", "async text")
    assert await files.read(f"{workdir}/a.txt") == "async text"

    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(3):
            yield f"part{i};".encode()

    await files.write(f"{workdir}/b.bin", chunks())
    assert await files.read(f"{workdir}/b.bin", format="bytes") == b"part0;part1;part2;"
    stream = await files.read(f"{workdir}/b.bin", format="stream")
    assert b"".join([chunk async for chunk in stream]) == b"part0;part1;part2;"
    entries = [WriteEntry(path=f"{workdir}/{n}.txt", data=n) for n in ("c", "d")]
    infos = await files.write_files(entries, gzip=True)
    assert [i.name for i in infos] == ["c.txt", "d.txt"]


# -- downloads over raw HTTP --------------------------------------------------------------------


def test_download_headers_and_identity_by_default(
    sandbox: Sandbox, workdir: str, http: httpx.Client
) -> None:
    sandbox.files.write(f"{workdir}/report 1.txt", "a" * 1000)
    # httpx (and the SDK's plain reads) send "gzip, deflate": served uncompressed, for speed.
    response = http.get("/files", params={"path": f"{workdir}/report 1.txt"})
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    assert response.headers["content-length"] == "1000"
    assert response.headers["content-disposition"] == 'inline; filename="report 1.txt"'
    assert response.headers["accept-ranges"] == "bytes"
    # Asking for gzip specifically (the SDK's gzip=True) compresses.
    with http.stream("GET", "/files", params={"path": f"{workdir}/report 1.txt"},
                     headers={"accept-encoding": "gzip"}) as gz:
        assert gz.headers["content-encoding"] == "gzip"
        assert gzip.decompress(b"".join(gz.iter_raw())) == b"a" * 1000


def test_download_range(sandbox: Sandbox, workdir: str, http: httpx.Client) -> None:
    sandbox.files.write(f"{workdir}/digits", "0123456789")
    path = {"path": f"{workdir}/digits"}
    response = http.get("/files", params=path, headers={"range": "bytes=2-5"})
    assert (response.status_code, response.content) == (206, b"2345")
    assert response.headers["content-range"] == "bytes 2-5/10"
    response = http.get("/files", params=path, headers={"range": "bytes=-3"})
    assert (response.status_code, response.content) == (206, b"789")
    response = http.get("/files", params=path, headers={"range": "bytes=7-"})
    assert (response.status_code, response.content) == (206, b"789")
    response = http.get("/files", params=path, headers={"range": "bytes=20-30"})
    assert response.status_code == 416
    assert response.headers["content-range"] == "bytes */10"


def test_download_errors_are_json(sandbox: Sandbox, workdir: str, http: httpx.Client) -> None:
    response = http.get("/files", params={"path": f"{workdir}/missing"})
    assert response.status_code == 404
    assert response.json()["code"] == 404
    assert "does not exist" in response.json()["message"]
    assert http.get("/files", params={"path": workdir}).json()["code"] == 400
    assert http.get("/files", params={"path": "a\x00b"}).status_code == 400
    response = http.get("/files", params={"path": workdir, "username": "nobody-here"})
    assert response.status_code == 401


# -- uploads over raw HTTP ----------------------------------------------------------------------


def test_upload_multipart_filename_is_the_path(workdir: str, http: httpx.Client) -> None:
    files = [("file", (f"{workdir}/p/one.txt", b"1")), ("file", (f"{workdir}/two.txt", b"2")),
             ("other", (None, b"ignored form field"))]
    response = http.post("/files", files=files)
    assert response.status_code == 200
    assert response.json() == [
        {"path": f"{workdir}/p/one.txt", "name": "one.txt", "type": "file"},
        {"path": f"{workdir}/two.txt", "name": "two.txt", "type": "file"},
    ]


def test_upload_octet_stream_with_gzip(workdir: str, http: httpx.Client) -> None:
    body = gzip.compress(b"first member ") + gzip.compress(b"second member")
    response = http.post("/files", params={"path": f"{workdir}/gz"}, content=body, headers={
        "content-type": "application/octet-stream", "content-encoding": "gzip",
    })
    assert response.status_code == 200, response.text
    assert http.get("/files", params={"path": f"{workdir}/gz"}).content == (
        b"first member second member"
    )


@pytest.mark.parametrize(
    ("headers", "body", "params"),
    [
        ({"content-type": "application/octet-stream"}, b"x", {}),  # no path
        ({"content-type": "text/plain"}, b"x", {"path": "x"}),
        ({"content-type": "application/octet-stream", "content-encoding": "br"}, b"x",
         {"path": "x"}),
        ({"content-type": "application/octet-stream", "content-encoding": "gzip"}, b"not gzip",
         {"path": "x"}),
        ({"content-type": "application/octet-stream", "content-encoding": "gzip"},
         gzip.compress(b"truncated body")[:-6], {"path": "x"}),
        ({"content-type": "multipart/form-data"}, b"x", {}),  # no boundary
        ({"content-type": "multipart/form-data; boundary=b"}, b"garbage", {}),
        ({"content-type": "multipart/form-data; boundary=b"},
         b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nno filename\r\n--b--\r\n',
         {}),
        ({"content-type": "multipart/form-data; boundary=b"},
         b'--b\r\nContent-Disposition: form-data; name="file"; filename="cut"\r\n\r\nno end',
         {}),
        ({"content-type": "application/octet-stream", "x-metadata-": "v"}, b"x", {"path": "x"}),
        ({"content-type": "application/octet-stream"}, b"x", {"path": "a\x00b"}),
    ],
)
def test_upload_bad_input_is_a_400(
    http: httpx.Client, headers: dict[str, str], body: bytes, params: dict[str, str]
) -> None:
    params = {k: f"t-bad-{uuid.uuid4().hex[:6]}/{v}" if k == "path" and v == "x" else v
              for k, v in params.items()}
    response = http.post("/files", content=body, headers=headers, params=params)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == 400


def test_upload_same_path_twice_in_one_request(workdir: str, http: httpx.Client) -> None:
    files = [("file", (f"{workdir}/dup", b"1")), ("file", (f"{workdir}/dup", b"2"))]
    response = http.post("/files", files=files)
    assert response.status_code == 400
    assert "same path" in response.json()["message"]


def test_upload_as_unknown_user(workdir: str, http: httpx.Client) -> None:
    response = http.post("/files", params={"path": f"{workdir}/x", "username": "nobody-here"},
                         content=b"x", headers={"content-type": "application/octet-stream"})
    assert response.status_code == 401
    assert response.json() == {"code": 401, "message": "invalid username: 'nobody-here'"}


# -- an envd with an access token: header or signed URLs ----------------------------------------


@pytest.fixture(scope="module")
def secured() -> Iterator[EnvdSandbox]:
    """A second envd, initialised with an access token (one per module: each costs ~1 s)."""
    sandbox = start_envd(free_port())
    try:
        assert httpx.post(f"{sandbox.url}/init", json={"accessToken": TOKEN}).status_code == 204
        yield sandbox
    finally:
        sandbox.stop()


@pytest.fixture
def secured_sdk(secured: EnvdSandbox) -> Sandbox:
    """An SDK sandbox that knows the token, as ``Sandbox.create()`` would outside debug mode."""
    headers = {"X-Access-Token": TOKEN, "E2b-Sandbox-Id": "debug_sandbox_id",
               "E2b-Sandbox-Port": "49983"}
    config = ConnectionConfig(sandbox_url=secured.url, debug=True, extra_sandbox_headers=headers)
    return Sandbox(sandbox_id="debug_sandbox_id", envd_version=Version("0.6.13"),
                   envd_access_token=TOKEN, sandbox_domain=None, connection_config=config)


def test_secured_sdk_uses_the_header(secured_sdk: Sandbox) -> None:
    secured_sdk.files.write("/home/user/secured.txt", "ok")
    assert secured_sdk.files.read("/home/user/secured.txt") == "ok"


def test_secured_rejects_missing_or_wrong_credentials(secured: EnvdSandbox) -> None:
    url = f"{secured.url}/files"
    response = httpx.get(url, params={"path": "/home/user/secured.txt"})
    assert response.status_code == 401
    assert response.json()["code"] == 401
    response = httpx.get(url, params={"path": "/home/user/secured.txt"},
                         headers={"x-access-token": "wrong"})
    assert response.status_code == 401
    response = httpx.get(url, params={"path": "/home/user/secured.txt", "signature": "v1_bad"})
    assert response.json() == {"code": 401, "message": "invalid signature"}


def test_signed_upload_and_download_urls(secured_sdk: Sandbox) -> None:
    path = f"/home/user/signed-{uuid.uuid4().hex[:6]}.txt"
    upload_url = secured_sdk.upload_url(path)
    assert "signature=v1_" in upload_url
    response = httpx.post(upload_url, files={"file": ("ignored-name", b"signed content")})
    assert response.status_code == 200, response.text
    assert response.json()[0]["path"] == path
    download_url = secured_sdk.download_url(path, use_signature_expiration=60)
    assert "signature_expiration=" in download_url
    assert httpx.get(download_url).content == b"signed content"
    # A signature is bound to its operation and path.
    assert httpx.get(upload_url).status_code == 401
    other = secured_sdk.download_url("/home/user/other.txt").replace("other.txt", path[11:])
    assert httpx.get(other).status_code == 401


def test_signed_url_for_another_user(secured_sdk: Sandbox) -> None:
    url = secured_sdk.upload_url("owned-by-root.txt", user="root")
    assert httpx.post(url, content=b"r", headers={
        "content-type": "application/octet-stream"}).status_code == 200
    assert secured_sdk.files.get_info("/root/owned-by-root.txt", user="root").owner == "root"


def test_expired_signature(secured_sdk: Sandbox) -> None:
    url = secured_sdk.download_url("/home/user/secured.txt", use_signature_expiration=-10)
    response = httpx.get(url)
    assert response.status_code == 401
    assert response.json() == {"code": 401, "message": "signature is already expired"}
    bad = url.replace("signature_expiration=", "signature_expiration=x")
    assert httpx.get(bad).status_code == 400


def test_large_round_trip(sandbox: Sandbox, workdir: str) -> None:
    data = os.urandom(16 * 1024 * 1024)
    start = time.monotonic()
    sandbox.files.write(f"{workdir}/large.bin", data)
    assert sandbox.files.read(f"{workdir}/large.bin", format="bytes") == data
    assert time.monotonic() - start < 10
