"""Leaf package: errors, process runner, settings. Imports nothing else from aenv."""
