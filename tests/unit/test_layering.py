"""Nothing above ``runtime/`` names a concrete runtime or its files: the driver is chosen by
config (``runtime/registry.py``) and asked what it needs (``Runtime.image_requirements``), so a
new driver is one module and one registry entry."""

from __future__ import annotations

import re
from pathlib import Path

import aenv

PACKAGE = Path(aenv.__file__).parent
#: Every layer of the node above the runtime's (pyproject.toml's layers contract). Not the
#: CLI: ``aenv doctor`` tells operators about each driver by name (through
#: ``runtime/host_probe.py``), and chooses none.
ABOVE_RUNTIME = ["api", "proxy", "cluster", "edge", "orchestrator", "templates", "compose",
                 "server.py"]
DRIVER_NAMES = re.compile(r"gvisor|runsc", re.IGNORECASE)


def test_no_layer_above_the_runtime_names_a_driver() -> None:
    found = []
    for part in ABOVE_RUNTIME:
        root = PACKAGE / part
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if DRIVER_NAMES.search(line):
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
