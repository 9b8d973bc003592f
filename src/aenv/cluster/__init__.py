"""Cluster mode: many nodes behind gateways and schedulers, with their shared state in Redis.

Redis holds what the cluster knows of itself and nothing it could not rebuild: each node's
last heartbeat (capacity, load, caches, roster) and the reservations schedulers made on it
(``keys.py`` names every key). Nodes are the truth for what they run; the shared snapshot
repository is the truth for paused sandboxes and snapshots.

- ``model.py``: a node as its heartbeat describes it, and its health by heartbeat age.
- ``registry.py``: heartbeats written and read (one Lua script each way, on Redis's clock).
- ``reserve.py``: atomic reservations, so concurrent schedulers never double-book a node.
- ``placement.py``: which node: filter, sample, score (pure; no I/O).
- ``scheduler.py``: the scheduler's HTTP API (:9090), placement over the two above.
- ``heartbeat.py``: a node's side: measure itself, send a heartbeat every couple of seconds.
- ``settings.py``: the scheduler's and the gateway's typed settings (``AENV_*``).
"""
