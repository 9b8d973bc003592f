"""Network test fixtures (shared with tests/runtime)."""

from tests.network.fixtures import internet, nft_table_cleanup, pool

__all__ = ["internet", "nft_table_cleanup", "pool"]
