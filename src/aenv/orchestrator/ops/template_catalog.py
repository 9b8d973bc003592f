"""Built templates as E2B lists and names them: aliases, the list, tags, and delete (of a
built template or a committed snapshot, E2B's two kinds of template).

Owns the template store's rows of templates and tags on behalf of the API; builds themselves
are ``template_build.py``'s and the builder's. Every call here is a few SQLite statements and
at most one repository delete, each on its own: a crash between two of them leaves what the
next call, or garbage collection, sees through (a tag that points at a deleted build is never
followed; a memory image whose manifest is gone is collected).

A template is found by id or by name (E2B's alias), with an optional ``:tag`` after the name
that only ``assign_tags`` reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aenv.core.errors import Conflict, InvalidArgument, NotFound
from aenv.orchestrator.builder import Builder
from aenv.orchestrator.context import Node
from aenv.store.templates import DEFAULT_TAG, BuildRecord, TemplateRecord, TemplateStore

_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def building(node: Node) -> tuple[TemplateStore, Builder]:
    """The node's template store and builder."""
    return node.template_store, node.builder


def split_name(name: str) -> tuple[str, str | None]:
    """``name[:tag]`` → (name, tag); E2B's names may carry a tag after a colon."""
    base, sep, tag = name.partition(":")
    return base, (tag if sep else None)


def check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise InvalidArgument(f"invalid tag {tag!r}")
    return tag


async def require_template(store: TemplateStore, template_id: str) -> TemplateRecord:
    """The template named (id or ``name[:tag]``); ``NotFound`` as E2B words it."""
    record = await store.get_template(split_name(template_id)[0])
    if record is None:
        raise NotFound(f"template '{template_id}' not found")
    return record


async def find_alias(node: Node, alias: str) -> TemplateRecord:
    """The template an alias (a name) names.

    Prerequisites: none. On success: its record.
    On failure: ``NotFound`` ("template alias ... not found").
    """
    record = await building(node)[0].get_template(split_name(alias)[0])
    if record is None:
        raise NotFound(f"template alias '{alias}' not found")
    return record


@dataclass(frozen=True)
class TemplateSummary:
    """A template as ``GET /templates`` shows it: the build its ``default`` tag names (else
    its newest), and how many builds it has."""

    template: TemplateRecord
    shown: BuildRecord | None
    build_count: int


async def list_templates(node: Node) -> list[TemplateSummary]:
    """Every built template, newest first.

    Prerequisites: none. On success: one summary per template.
    On failure: none expected. Reads only.
    """
    store, _ = building(node)
    found = []
    for record in await store.list_templates():
        builds = await store.builds(record.template_id)
        default = await store.tagged_build(record.template_id, DEFAULT_TAG)
        shown = next((b for b in builds if b.build_id == default), builds[0] if builds else None)
        found.append(TemplateSummary(record, shown, len(builds)))
    return found


async def list_tags(node: Node, template_id: str) -> list[tuple[str, str, float]]:
    """``(tag, build_id, created_at)`` of a template, oldest first.

    Prerequisites: none. On success: its tags.
    On failure: ``NotFound`` (no such template). Reads only.
    """
    store, _ = building(node)
    record = await require_template(store, template_id)
    return await store.tags(record.template_id)


async def assign_tags(node: Node, target: str, tags: list[str]) -> str:
    """Point ``tags`` at the build ``target`` (``name[:tag]``, the default tag if none) names.

    Prerequisites: every tag is well formed.
    On success: the build id; each tag now names that build (moved if it named another).
    On failure: ``NotFound`` (no such template, or no build with that tag), ``InvalidArgument``
    (a malformed tag); no tag has moved.
    """
    store, _ = building(node)
    name, tag = split_name(target)
    record = await require_template(store, name)
    build_id = await store.tagged_build(record.template_id, tag or DEFAULT_TAG)
    if build_id is None:
        raise NotFound(f"template '{target}' has no build with that tag")
    for t in [check_tag(t) for t in tags]:
        await store.set_tag(record.template_id, t, build_id)
    return build_id


async def delete_tags(node: Node, name: str, tags: list[str]) -> None:
    """Remove ``tags`` from template ``name`` (tags it does not have are no error).

    Prerequisites: ``default`` is not among the tags.
    On success: none of the tags names a build of the template any more; builds stay.
    On failure: ``NotFound`` (no such template), ``InvalidArgument`` (the default tag, which
    always follows the newest ready build); no tag was removed.
    """
    store, _ = building(node)
    record = await require_template(store, name)
    if DEFAULT_TAG in tags:
        raise InvalidArgument("the default tag cannot be removed")
    for tag in tags:
        await store.remove_tag(record.template_id, tag)


async def delete_template(node: Node, name_or_id: str) -> None:
    """``DELETE /templates/{id}``: a built template, else a committed snapshot by id or name.

    Prerequisites: no build of the template runs.
    On success: a built template's records (builds, tags, logs) and the memory images of its
    builds are gone (its layers stay for the layer cache to account: other templates may
    share them); or the snapshot's manifest is gone (its blobs go with GC). Sandboxes
    already started from either run on: a restore reads the image once.
    On failure: ``NotFound`` (neither exists, or the id names a template image or a paused
    sandbox rather than a user's snapshot), ``Conflict`` (a build of it runs; nothing was
    deleted), ``Unavailable`` (the repository). A failure between the images and the records
    leaves the records, so a second delete finishes the job.
    """
    if not await _delete_built(node, name_or_id):
        snapshot = await node.repository.lookup(name_or_id)
        if snapshot is None or snapshot.manifest.kind != "snapshot":
            raise NotFound(f"template '{name_or_id}' not found")
        await node.repository.delete(snapshot.snapshot_id)


async def _delete_built(node: Node, name_or_id: str) -> bool:
    record = await node.template_store.get_template(split_name(name_or_id)[0])
    if record is None:
        return False
    store, builder = building(node)
    if any(builder.running(b.build_id) for b in await store.builds(record.template_id)):
        raise Conflict(f"template '{record.name}' is being built; try again when it ends")
    # Listed again: a build that finished since the check has an image to delete too.
    for build in await store.builds(record.template_id):
        if build.snapshot_id and node.repository.get(build.snapshot_id) is not None:
            await node.repository.delete(build.snapshot_id)
    await store.delete_template(record.template_id)
    return True
