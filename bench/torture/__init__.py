"""The lifecycle torture (issue 21): many sandboxes, random overlapping operations from many
clients, the node killed with SIGKILL at random moments, and invariants checked throughout.

``tests/server/test_torture.py`` runs the short form in CI; ``python -m bench.torture`` the
long form (``make bench``: 30 min, 50 sandboxes). Parts: ``world.py`` what the clients know
and found, ``actions.py`` the operations, ``checks.py`` the invariants (settling, kill time,
checksums, leaks), ``run.py`` the clients and the chaos.
"""
