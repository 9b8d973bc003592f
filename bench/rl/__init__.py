"""The RL rollout cost benchmark (issue 12, ``aenv bench rl``): one workload run three ways
(cold, template, fork) on one node, metered. ``bench/rl_bench.py`` is the entry point."""
