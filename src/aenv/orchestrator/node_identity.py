"""This node's name, the same before and after a restart (the cluster's and the volumes' key)."""

from __future__ import annotations

import os

from aenv.core.settings import Settings


def node_id(settings: Settings) -> str:
    """``node_id`` from the settings, else the one kept in ``<home>/node_id`` (made once:
    the host name and a random suffix, so two nodes on one host differ)."""
    if settings.node_id:
        return settings.node_id
    path = settings.home / "node_id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        made = f"{os.uname().nodename}-{os.urandom(3).hex()}"
        path.write_text(made + "\n")
        return made
