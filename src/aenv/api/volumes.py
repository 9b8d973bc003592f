"""E2B's volumes: ``/volumes`` (the API key) and ``/volumecontent/{id}/…`` (the volume's token),
as the official SDKs call them (docs/volumes-protocol.md has the wire contract). Thin
handlers over ``orchestrator/volumes.py`` and ``orchestrator/ops/volume_content.py``.

The content plane's error body has a *string* ``code`` (``PATH_NOT_FOUND``…), unlike the rest
of the API: ``edge/errors.py`` renders it so for these paths.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from aenv.api.auth import CallerDep
from aenv.api.node import NodeDep
from aenv.api.ownership import guard_path
from aenv.api.volume_tokens import check, mint
from aenv.core.errors import InvalidArgument, NotFound
from aenv.core.ids import is_volume_id
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops import volume_content as content
from aenv.storage.volume_catalog import VolumeManifest
from aenv.storage.volume_files import EntryStat

volumes = APIRouter(dependencies=[Depends(guard_path)])
volume_content = APIRouter()

U32 = Annotated[int, Field(ge=0, le=0xFFFFFFFF)]


class NewVolume(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = Field(max_length=1000)
    #: aenv's own (the SDKs send only ``name``): the volume's size, its quota.
    size_mb: int | None = Field(default=None, alias="sizeMB", ge=16)


class VolumeOut(BaseModel):
    volumeID: str
    name: str
    #: aenv's own.
    sizeMB: int | None = None


class VolumeAndToken(VolumeOut):
    token: str


class VolumeEntryStat(BaseModel):
    name: str
    type: str
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: str
    mtime: str
    ctime: str
    target: str | None = None


class MetadataBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uid: U32 | None = None
    gid: U32 | None = None
    mode: U32 | None = None


def _out(m: VolumeManifest) -> VolumeOut:
    return VolumeOut(volumeID=m.volume_id, name=m.name, sizeMB=m.size_bytes >> 20)


def _with_token(request: Request, node: Node, m: VolumeManifest) -> VolumeAndToken:
    token = mint(request.app.state.api_key, m.volume_id, node.settings.volume_token_ttl_s)
    return VolumeAndToken(**_out(m).model_dump(), token=token)


def _checked(volume_id: str) -> str:
    if not is_volume_id(volume_id):
        raise InvalidArgument("Invalid volume ID")
    return volume_id


# -- the control plane ---------------------------------------------------------------------------

@volumes.post("/volumes", status_code=201, response_model=VolumeAndToken,
              response_model_exclude_none=True)
async def create_volume(body: NewVolume, node: NodeDep, request: Request,
                        caller: CallerDep) -> VolumeAndToken:
    manifest = await node.volumes.create(body.name, body.size_mb, node.tenancy.stamp(caller))
    return _with_token(request, node, manifest)


@volumes.get("/volumes", response_model=list[VolumeOut], response_model_exclude_none=True)
async def list_volumes(node: NodeDep, caller: CallerDep) -> list[VolumeOut]:
    return [_out(m) for m in await node.volumes.list()
            if node.tenancy.is_team(caller, m.team_id)]


@volumes.get("/volumes/{volume_id}", response_model=VolumeAndToken,
             response_model_exclude_none=True)
async def get_volume(volume_id: str, node: NodeDep, request: Request) -> VolumeAndToken:
    return _with_token(request, node, await node.volumes.get(_checked(volume_id)))


@volumes.delete("/volumes/{volume_id}", status_code=204)
async def delete_volume(volume_id: str, node: NodeDep) -> Response:
    await node.volumes.delete(_checked(volume_id))
    return Response(status_code=204)


# -- the content plane ---------------------------------------------------------------------------

def _authorized(request: Request, volume_id: str) -> str:
    if not is_volume_id(volume_id):
        raise NotFound(f"volume {volume_id} not found")
    check(request.app.state.api_key, request.headers.get("authorization"), volume_id)
    return volume_id


def _stat(entry: EntryStat) -> VolumeEntryStat:
    return VolumeEntryStat(
        name=entry.name, type=entry.type, path=entry.path, size=entry.size, mode=entry.mode,
        uid=entry.uid, gid=entry.gid, atime=entry.atime.isoformat(),
        mtime=entry.mtime.isoformat(), ctime=entry.ctime.isoformat(), target=entry.target)


Path_ = Annotated[str, Query(alias="path", min_length=1, max_length=4096)]
_STAT = {"response_model": VolumeEntryStat, "response_model_exclude_none": True}


@volume_content.get("/volumecontent/{volume_id}/path", **_STAT)  # type: ignore[arg-type]
async def stat_path(volume_id: str, path: Path_, node: NodeDep,
                    request: Request) -> VolumeEntryStat:
    vid = _authorized(request, volume_id)
    return _stat(await content.stat(node, vid, path))


@volume_content.patch("/volumecontent/{volume_id}/path", **_STAT)  # type: ignore[arg-type]
async def update_path(volume_id: str, path: Path_, body: MetadataBody, node: NodeDep,
                      request: Request) -> VolumeEntryStat:
    vid = _authorized(request, volume_id)
    return _stat(await content.update(node, vid, path, uid=body.uid, gid=body.gid,
                                      mode=body.mode))


@volume_content.delete("/volumecontent/{volume_id}/path", status_code=204)
async def remove_path(volume_id: str, path: Path_, node: NodeDep, request: Request) -> Response:
    await content.remove(node, _authorized(request, volume_id), path)
    return Response(status_code=204)


@volume_content.get("/volumecontent/{volume_id}/dir", response_model=list[VolumeEntryStat],
                    response_model_exclude_none=True)
async def list_path(volume_id: str, path: Path_, node: NodeDep, request: Request,
                    depth: Annotated[U32 | None, Query()] = None) -> list[VolumeEntryStat]:
    vid = _authorized(request, volume_id)
    return [_stat(e) for e in await content.list_dir(node, vid, path, depth)]


@volume_content.post("/volumecontent/{volume_id}/dir", status_code=201,
                     **_STAT)  # type: ignore[arg-type]
async def make_dir(volume_id: str, path: Path_, node: NodeDep, request: Request,
                   uid: Annotated[U32 | None, Query()] = None,
                   gid: Annotated[U32 | None, Query()] = None,
                   mode: Annotated[U32 | None, Query()] = None,
                   force: bool = False) -> VolumeEntryStat:
    vid = _authorized(request, volume_id)
    return _stat(await content.make_dir(node, vid, path, uid=uid, gid=gid, mode=mode,
                                        force=force))


@volume_content.get("/volumecontent/{volume_id}/file")
async def read_file(volume_id: str, path: Path_, node: NodeDep,
                    request: Request) -> StreamingResponse:
    # No Content-Length (as E2B's): a sandbox may change the file while it is sent.
    _, pieces = await content.read(node, _authorized(request, volume_id), path)
    return StreamingResponse(pieces, media_type="application/octet-stream")


@volume_content.put("/volumecontent/{volume_id}/file", status_code=201,
                    **_STAT)  # type: ignore[arg-type]
async def write_file(volume_id: str, path: Path_, node: NodeDep, request: Request,
                     uid: Annotated[U32 | None, Query()] = None,
                     gid: Annotated[U32 | None, Query()] = None,
                     mode: Annotated[U32 | None, Query()] = None,
                     force: bool = False) -> VolumeEntryStat:
    vid = _authorized(request, volume_id)
    return _stat(await content.write(node, vid, path, request.stream(), uid=uid, gid=gid,
                                     mode=mode, force=force))
