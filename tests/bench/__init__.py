"""Tests of the benchmarks that users run through the CLI (``aenv bench``)."""
