"""Node state in SQLite (WAL): sandboxes and their events, with schema migrations.

Nothing here knows about runtimes or HTTP; the orchestrator is the only writer.
"""
