"""The sandbox lifecycle: state machine, TTL, sequencing of runtime/storage/network, recovery.

Operations are module-level ``async def`` functions in ``ops/`` over a small context
(:class:`aenv.orchestrator.context.Node`). The API and the proxy call them; drivers never call back.
"""
