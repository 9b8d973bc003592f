"""Cluster benchmark (issue 13, ``make bench``): what the gateway and scheduler cost.

On issue 13's layout (``tests/cluster/layout.py``: nodes in network namespaces of their own,
two schedulers, two gateways, a real Redis and S3 server), three measurements, each next to
its floor measured in the same run:

- **gateway latency** (``latency.py``): a sandbox's info (``GET /sandboxes/{id}``) and an envd
  call (a file read) through the gateway against the same call sent straight to the node,
  interleaved one for one; the ratio of the p50s is the gateway's cost;
- **placement** (``placement.py``): the scheduler's ``POST /v1/placements`` (filter, sample,
  score, reserve in Redis) and the cancel of the reservation, against a Redis ``PING``;
- **creates/s** (``throughput.py``): a burst of creates through a gateway with three nodes
  against the same burst with one node.

Writes ``bench/results/cluster.json`` and prints a markdown table (docs/benchmarks.md,
"Cluster").
"""
