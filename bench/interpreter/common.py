"""What the parts of the interpreter benchmark share."""

from __future__ import annotations

import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "interpreter.json"
#: The first build on a machine downloads ~115 MB; later ones take ~80 s.
BUILD_WITHIN_S = 1200.0
SANDBOX_TIMEOUT_S = 600


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
