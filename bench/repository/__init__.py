"""Parts of the repository benchmark (``bench/repository_bench.py``), one module each."""
