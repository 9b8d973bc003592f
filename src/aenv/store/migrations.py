"""Schema migrations: an ordered list, applied once each, recorded in ``schema_version``."""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: sandboxes and their event log
    """
    CREATE TABLE sandboxes (
        sandbox_id TEXT PRIMARY KEY,
        template_id TEXT NOT NULL,
        state TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL NOT NULL,
        end_at REAL NOT NULL,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        disk_size_mb INTEGER NOT NULL,
        envd_token TEXT NOT NULL,
        client_id TEXT NOT NULL,
        alias TEXT,
        metadata TEXT,
        env_vars TEXT,
        auto_pause INTEGER NOT NULL DEFAULT 0,
        auto_resume INTEGER NOT NULL DEFAULT 0,
        allow_internet_access INTEGER,
        network TEXT,
        instance TEXT,
        state_changed_at REAL NOT NULL DEFAULT 0,
        last_error TEXT
    );
    CREATE INDEX sandboxes_end_at ON sandboxes (state, end_at);
    CREATE INDEX sandboxes_started_at ON sandboxes (started_at, sandbox_id);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        sandbox_id TEXT NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_sandbox ON events (sandbox_id, id);
    """,
]
