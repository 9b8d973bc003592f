"""Templates, their builds, tags and build logs in the node's SQLite database.

A *template* is a name (unique, E2B's alias) with resources; a *build* is one attempt to make it
(``waiting`` → ``building`` → ``ready`` | ``error``); a ready build points at the committed
repository snapshot (kind ``template``) that sandboxes are restored from. Tags map
``name:tag`` to a build; ``default`` follows the newest ready build. The artifacts themselves
(layers, memory image) live in the layer store and the snapshot repository, never here.

Build logs are append-only rows numbered from 0 per build, so a client's ``logsOffset`` is a
row number and polling never misses or repeats a line.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import aiosqlite

from aenv.core.errors import AlreadyExists, Conflict, NotFound
from aenv.store.transactions import transaction

BuildStatus = Literal["waiting", "building", "ready", "error"]
TERMINAL: tuple[BuildStatus, ...] = ("ready", "error")
DEFAULT_TAG = "default"


@dataclass(frozen=True)
class TemplateRecord:
    template_id: str
    name: str
    created_at: float
    updated_at: float
    cpu_count: int
    memory_mb: int
    public: bool = False
    spawn_count: int = 0
    last_spawned_at: float | None = None


@dataclass(frozen=True)
class BuildRecord:
    build_id: str
    template_id: str
    status: BuildStatus
    created_at: float
    updated_at: float
    cpu_count: int
    memory_mb: int
    finished_at: float | None = None
    snapshot_id: str | None = None
    reason: str | None = None
    reason_step: str | None = None


@dataclass(frozen=True)
class LogEntry:
    seq: int
    at: float
    level: str
    message: str
    step: str | None = None


def _template(row: aiosqlite.Row) -> TemplateRecord:
    return TemplateRecord(
        template_id=row["template_id"], name=row["name"], created_at=row["created_at"],
        updated_at=row["updated_at"], cpu_count=row["cpu_count"], memory_mb=row["memory_mb"],
        public=bool(row["public"]), spawn_count=row["spawn_count"],
        last_spawned_at=row["last_spawned_at"],
    )


def _build(row: aiosqlite.Row) -> BuildRecord:
    return BuildRecord(
        build_id=row["build_id"], template_id=row["template_id"], status=row["status"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        cpu_count=row["cpu_count"], memory_mb=row["memory_mb"],
        finished_at=row["finished_at"], snapshot_id=row["snapshot_id"],
        reason=row["reason"], reason_step=row["reason_step"],
    )


class TemplateStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    # -- templates ---------------------------------------------------------------------------

    async def insert_template(self, record: TemplateRecord) -> None:
        try:
            await self._db.execute(
                "INSERT INTO templates (template_id, name, created_at, updated_at, cpu_count,"
                " memory_mb, public) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.template_id, record.name, record.created_at, record.updated_at,
                 record.cpu_count, record.memory_mb, int(record.public)),
            )
        except aiosqlite.IntegrityError as exc:
            raise AlreadyExists(f"template '{record.name}' already exists") from exc

    async def update_template(self, record: TemplateRecord, **changes: Any) -> TemplateRecord:
        new = replace(record, **changes, updated_at=time.time())
        await self._db.execute(
            "UPDATE templates SET cpu_count = ?, memory_mb = ?, public = ?, updated_at = ?,"
            " spawn_count = ?, last_spawned_at = ? WHERE template_id = ?",
            (new.cpu_count, new.memory_mb, int(new.public), new.updated_at, new.spawn_count,
             new.last_spawned_at, new.template_id),
        )
        return new

    async def count_spawn(self, template_id: str, at: float) -> None:
        await self._db.execute(
            "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = ?"
            " WHERE template_id = ?", (at, template_id),
        )

    async def get_template(self, template_id_or_name: str) -> TemplateRecord | None:
        async with self._db.execute(
            "SELECT * FROM templates WHERE template_id = ? OR name = ?",
            (template_id_or_name, template_id_or_name),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else _template(row)

    async def require_template(self, template_id_or_name: str) -> TemplateRecord:
        record = await self.get_template(template_id_or_name)
        if record is None:
            raise NotFound(f"template '{template_id_or_name}' not found")
        return record

    async def list_templates(self) -> builtins.list[TemplateRecord]:
        async with self._db.execute("SELECT * FROM templates ORDER BY created_at DESC") as cur:
            rows = await cur.fetchall()
        return [_template(r) for r in rows]

    async def delete_template(self, template_id: str) -> None:
        """Remove the template with its builds, tags and logs (its artifacts are the caller's)."""
        async with transaction(self._db):
            await self._db.execute(
                "DELETE FROM build_logs WHERE build_id IN"
                " (SELECT build_id FROM template_builds WHERE template_id = ?)", (template_id,))
            for table in ("template_builds", "template_tags", "templates"):
                await self._db.execute(
                    f"DELETE FROM {table} WHERE template_id = ?", (template_id,))

    # -- builds ------------------------------------------------------------------------------

    async def insert_build(self, record: BuildRecord) -> None:
        await self._db.execute(
            "INSERT INTO template_builds (build_id, template_id, status, created_at, updated_at,"
            " cpu_count, memory_mb) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.build_id, record.template_id, record.status, record.created_at,
             record.updated_at, record.cpu_count, record.memory_mb),
        )

    async def get_build(self, template_id: str, build_id: str) -> BuildRecord | None:
        async with self._db.execute(
            "SELECT * FROM template_builds WHERE build_id = ? AND template_id = ?",
            (build_id, template_id),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else _build(row)

    async def require_build(self, template_id: str, build_id: str) -> BuildRecord:
        record = await self.get_build(template_id, build_id)
        if record is None:
            raise NotFound(f"build '{build_id}' of template '{template_id}' not found")
        return record

    async def builds(
        self, template_id: str, statuses: Sequence[BuildStatus] | None = None
    ) -> builtins.list[BuildRecord]:
        """The template's builds, newest first."""
        query = "SELECT * FROM template_builds WHERE template_id = ?"
        args: list[Any] = [template_id]
        if statuses is not None:
            query += f" AND status IN ({', '.join('?' for _ in statuses)})"
            args.extend(statuses)
        async with self._db.execute(query + " ORDER BY created_at DESC", args) as cur:
            rows = await cur.fetchall()
        return [_build(r) for r in rows]

    async def all_builds(self, statuses: Sequence[BuildStatus]) -> builtins.list[BuildRecord]:
        marks = ", ".join("?" for _ in statuses)
        async with self._db.execute(
            f"SELECT * FROM template_builds WHERE status IN ({marks})", list(statuses)
        ) as cur:
            rows = await cur.fetchall()
        return [_build(r) for r in rows]

    async def set_build_status(
        self, record: BuildRecord, status: BuildStatus, **changes: Any
    ) -> BuildRecord:
        """Move a build on, compare-and-set on its current status (``Conflict`` if it moved)."""
        now = time.time()
        new = replace(record, status=status, updated_at=now, **changes)
        if status in TERMINAL and new.finished_at is None:
            new = replace(new, finished_at=now)
        cur = await self._db.execute(
            "UPDATE template_builds SET status = ?, updated_at = ?, finished_at = ?,"
            " snapshot_id = ?, reason = ?, reason_step = ?, cpu_count = ?, memory_mb = ?"
            " WHERE build_id = ? AND status = ?",
            (new.status, new.updated_at, new.finished_at, new.snapshot_id, new.reason,
             new.reason_step, new.cpu_count, new.memory_mb, record.build_id, record.status),
        )
        if cur.rowcount != 1:
            raise Conflict(f"build {record.build_id} changed concurrently")
        return new

    # -- tags --------------------------------------------------------------------------------

    async def set_tag(self, template_id: str, tag: str, build_id: str) -> None:
        await self._db.execute(
            "INSERT INTO template_tags (template_id, tag, build_id, created_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (template_id, tag)"
            " DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at",
            (template_id, tag, build_id, time.time()),
        )

    async def remove_tag(self, template_id: str, tag: str) -> bool:
        cur = await self._db.execute(
            "DELETE FROM template_tags WHERE template_id = ? AND tag = ?", (template_id, tag))
        return cur.rowcount == 1

    async def tags(self, template_id: str) -> builtins.list[tuple[str, str, float]]:
        """``(tag, build_id, created_at)`` of the template, oldest first."""
        async with self._db.execute(
            "SELECT tag, build_id, created_at FROM template_tags WHERE template_id = ?"
            " ORDER BY created_at", (template_id,),
        ) as cur:
            rows = await cur.fetchall()
        return [(r["tag"], r["build_id"], r["created_at"]) for r in rows]

    async def tagged_build(self, template_id: str, tag: str) -> str | None:
        async with self._db.execute(
            "SELECT build_id FROM template_tags WHERE template_id = ? AND tag = ?",
            (template_id, tag),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row["build_id"])

    # -- the step cache ----------------------------------------------------------------------

    async def cached_layer(self, cache_key: str) -> str | None:
        """The layer a forced build last made for ``cache_key`` (None: the key names itself)."""
        async with self._db.execute(
            "SELECT layer_id FROM build_cache WHERE cache_key = ?", (cache_key,)
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row["layer_id"])

    async def set_cached_layer(self, cache_key: str, layer_id: str) -> None:
        await self._db.execute(
            "INSERT INTO build_cache (cache_key, layer_id, at) VALUES (?, ?, ?)"
            " ON CONFLICT (cache_key) DO UPDATE SET layer_id = excluded.layer_id,"
            " at = excluded.at", (cache_key, layer_id, time.time()),
        )

    # -- logs --------------------------------------------------------------------------------

    async def append_log(
        self, build_id: str, level: str, message: str, step: str | None = None
    ) -> None:
        await self._db.execute(
            "INSERT INTO build_logs (build_id, seq, at, level, message, step) VALUES"
            " (?, (SELECT COALESCE(MAX(seq) + 1, 0) FROM build_logs WHERE build_id = ?),"
            " ?, ?, ?, ?)",
            (build_id, build_id, time.time(), level, message, step),
        )

    async def logs(
        self, build_id: str, *, offset: int = 0, limit: int = 100, level: str | None = None
    ) -> builtins.list[LogEntry]:
        query = "SELECT * FROM build_logs WHERE build_id = ? AND seq >= ?"
        args: list[Any] = [build_id, offset]
        if level is not None:
            query += " AND level = ?"
            args.append(level)
        query += " ORDER BY seq LIMIT ?"
        args.append(limit)
        async with self._db.execute(query, args) as cur:
            rows = await cur.fetchall()
        return [LogEntry(r["seq"], r["at"], r["level"], r["message"], r["step"]) for r in rows]
