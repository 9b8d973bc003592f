"""Benchmarks (``make bench``); results go to bench/results/ (gitignored), summaries to
docs/benchmarks.md."""
