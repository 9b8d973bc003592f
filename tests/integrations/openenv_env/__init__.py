"""A tiny OpenEnv environment for ``test_openenv.py``: a question per task, a reward of 1.0 for
the right answer. Written with OpenEnv's own server API (``create_app``); the server runs in
an aenv template (``Dockerfile``), the client (:mod:`.client`) on the host."""
