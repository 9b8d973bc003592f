"""Wire code generated from proto/*.proto by `make gen`. Never edit by hand."""
