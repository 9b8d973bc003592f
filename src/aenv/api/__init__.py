"""The HTTP API: E2B's control plane (v1 + v2 routes), auth, error bodies."""
