"""aenv: isolated Linux sandboxes for AI agents, behind an E2B-compatible API."""

__version__ = "0.1.0"
