"""One module per operation."""
