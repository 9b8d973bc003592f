"""Network test fixtures (shared with tests/runtime)."""

from tests.network.fixtures import internet, lan, nft_table_cleanup, pool

__all__ = ["internet", "lan", "nft_table_cleanup", "pool"]
