"""Stand-in for ``pyqwest`` in the envd bundle (shipped as ``site-packages/pyqwest``).

connectrpc imports pyqwest (its HTTP client, a Rust extension) from modules envd loads but never
runs on its path: the generated ``*_connect.py`` import the client classes, and the gRPC server
protocol imports ``Headers`` for trailers. envd serves the Connect protocol only (what the E2B
SDKs speak), so those imports just need names. Every name here is a class that refuses to be
instantiated, so a code path that would really need pyqwest (a Connect client, a gRPC request)
fails loudly instead of misbehaving. The real pyqwest extension costs ~12 MiB per sandbox in
gVisor, where a mapped library is resident in full (docs/density.md).

Not imported on the host (the bundle build copies this file; ``envd/bundle_sources.py``).
"""

from __future__ import annotations

from typing import Any

#: Why a placeholder refused to work (also the error message).
MISSING = "pyqwest is not in the envd bundle: envd serves the Connect protocol only"


class _Missing:
    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError(MISSING)


_made: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _made:
        _made[name] = type(name, (_Missing,), {"__module__": __name__})
    return _made[name]
