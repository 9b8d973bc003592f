"""Processes started through ``process.Process``: spawning, output fan-out, the RPC service."""
