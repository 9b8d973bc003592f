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
    # 2: templates (E2B template-build API), their builds and build logs
    """
    CREATE TABLE templates (
        template_id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        public INTEGER NOT NULL DEFAULT 0,
        spawn_count INTEGER NOT NULL DEFAULT 0,
        last_spawned_at REAL
    );
    CREATE TABLE template_builds (
        build_id TEXT PRIMARY KEY,
        template_id TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        snapshot_id TEXT,
        reason TEXT,
        reason_step TEXT
    );
    CREATE INDEX template_builds_template ON template_builds (template_id, created_at);
    CREATE TABLE template_tags (
        template_id TEXT NOT NULL,
        tag TEXT NOT NULL,
        build_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (template_id, tag)
    );
    CREATE TABLE build_logs (
        build_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at REAL NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL,
        step TEXT,
        PRIMARY KEY (build_id, seq)
    );
    """,
    # 3: which layer a build step's cache key names, where a forced (skip_cache) build made a
    # fresh one: later builds reuse the newest
    """
    CREATE TABLE build_cache (
        cache_key TEXT PRIMARY KEY,
        layer_id TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 4: what a timeout auto-pause keeps (E2B ``autoPauseMemory``; false: the files only)
    """
    ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
    """,
    # 5: the volumes a sandbox has mounted (name, path, volume id, read-only)
    """
    ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT;
    """,
    # 6: the audit log: who did what to which object, when, from where, with what outcome
    """
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        object_id TEXT,
        client TEXT,
        status INTEGER NOT NULL
    );
    CREATE INDEX audit_object ON audit (object_id, seq);
    """,
    # 7: teams, their API keys and access tokens (hashed), and which team owns what
    """
    ALTER TABLE sandboxes ADD COLUMN team_id TEXT;
    CREATE TABLE teams (
        team_id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        is_default INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        quota TEXT
    );
    CREATE TABLE credentials (
        key_id TEXT PRIMARY KEY,
        team_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        digest TEXT NOT NULL UNIQUE,
        value_length INTEGER NOT NULL,
        masked_prefix TEXT NOT NULL,
        masked_suffix TEXT NOT NULL,
        created_at REAL NOT NULL,
        last_used REAL
    );
    CREATE INDEX credentials_team ON credentials (team_id);
    CREATE TABLE owned (
        kind TEXT NOT NULL,
        object_id TEXT NOT NULL,
        team_id TEXT NOT NULL,
        PRIMARY KEY (kind, object_id)
    );
    ALTER TABLE audit ADD COLUMN team_id TEXT;
    ALTER TABLE audit ADD COLUMN key_name TEXT;
    """,
    # 8: a team's secrets (their values encrypted; orchestrator/secrets.py)
    """
    CREATE TABLE secrets (
        secret_id TEXT PRIMARY KEY,
        team_id TEXT NOT NULL,
        name TEXT NOT NULL,
        current_version INTEGER NOT NULL,
        metadata TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        sealed BLOB NOT NULL,
        UNIQUE (team_id, name)
    );
    """,
    # 9: a sandbox's workload identity tokens (E2B iam; orchestrator/workload_identity.py)
    """
    ALTER TABLE sandboxes ADD COLUMN identity_tokens TEXT;
    """,
    # 10: sandbox logs (E2B's logs API; orchestrator/sandbox_logs.py): lifecycle events and
    # the sandbox's console, kept after the sandbox for a while; where each console was read to
    """
    CREATE TABLE sandbox_logs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        sandbox_id TEXT NOT NULL,
        team_id TEXT,
        at REAL NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL,
        fields TEXT
    );
    CREATE INDEX sandbox_logs_by_sandbox ON sandbox_logs (sandbox_id, at, id);
    CREATE TABLE sandbox_log_offsets (
        sandbox_id TEXT PRIMARY KEY,
        console_offset INTEGER NOT NULL
    );
    """,
    # 11: each team's sandboxes up and starts, sampled (E2B's team metrics;
    # orchestrator/team_metrics.py)
    """
    CREATE TABLE team_samples (
        team_id TEXT NOT NULL,
        at INTEGER NOT NULL,
        concurrent INTEGER NOT NULL,
        starts INTEGER NOT NULL,
        PRIMARY KEY (team_id, at)
    );
    """,
    # 12: lifecycle webhooks (E2B's /events/webhooks; orchestrator/webhooks.py) and their
    # deliveries (the outbox: each kept until delivered or given up, a while after)
    """
    CREATE TABLE webhooks (
        webhook_id TEXT PRIMARY KEY,
        team_id TEXT NOT NULL,
        name TEXT NOT NULL,
        url TEXT NOT NULL,
        enabled INTEGER NOT NULL,
        events TEXT NOT NULL,
        sealed_secret BLOB,
        created_at REAL NOT NULL
    );
    CREATE TABLE webhook_deliveries (
        delivery_id TEXT PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        event_id TEXT NOT NULL,
        event_type TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        last_status INTEGER,
        last_error TEXT,
        created_at REAL NOT NULL,
        done_at REAL
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_at);
    CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (webhook_id, created_at);
    """,
]
