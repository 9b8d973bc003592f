"""Modules the envd bundle ships in place of distributions envd imports but never runs."""
