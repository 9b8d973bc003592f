"""What each of envd's imports costs inside gVisor: RSS and import time, per dependency.

Runs the bundle's own Python (``lib/ld-linux… --library-path lib lib/python3 -P -S -s -B``, as
``bin/envd`` does) inside a bare gVisor sandbox (``runsc do``: the host's filesystem read-only
under a tmpfs overlay, ``--network=none``, the node's platform) and imports envd's dependencies
step by step, in the order envd pulls them in. After each step it reads ``VmRSS`` from
``/proc/self/status`` as the sentry reports it (in gVisor a mapped shared library is resident in
full and private to the sandbox, so this is what the sandbox pays), and splits Python's
``-X importtime`` output at the step boundaries. A second pass imports each step's modules alone
in a fresh interpreter (marginal cost, overlapping with other steps). Finally the biggest
mappings of the fully imported interpreter (``/proc/self/smaps`` inside the sandbox).

    .venv/bin/python -m bench.envd_imports                      # build/envd-bundle
    .venv/bin/python -m bench.envd_imports --bundle /tmp/envd-bundle-lean --no-marginal

Prints a markdown table (docs/density.md has one). Steps whose modules the bundle does not ship
are reported as absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aenv.runtime.runsc import RUNSC

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = REPO / "build" / "envd-bundle"

#: (label, modules), cumulative, roughly in the order envd imports them.
STEPS: list[tuple[str, list[str]]] = [
    ("interpreter (-S, no site)", []),
    ("argparse, logging, faulthandler", ["argparse", "logging", "faulthandler"]),
    ("ssl (libssl, libcrypto)", ["ssl"]),
    ("asyncio", ["asyncio"]),
    ("protobuf runtime", ["protobuf"]),
    ("gen *_pb", ["aenv.envd.gen.process_pb", "aenv.envd.gen.filesystem_pb"]),
    ("pyqwest", ["pyqwest"]),
    ("connectrpc.server", ["connectrpc.server"]),
    ("connectrpc.client", ["connectrpc.client"]),
    ("gen *_connect", ["aenv.envd.gen.process_connect", "aenv.envd.gen.filesystem_connect"]),
    ("anyio", ["anyio"]),
    ("starlette (applications, routing, cors)",
     ["starlette.applications", "starlette.routing", "starlette.middleware.cors"]),
    ("python-multipart", ["python_multipart"]),
    ("h11", ["h11"]),
    ("httptools", ["httptools"]),
    ("click", ["click"]),
    ("uvicorn", ["uvicorn"]),
    ("uvicorn httptools protocol, lifespan",
     ["uvicorn.protocols.http.httptools_impl", "uvicorn.lifespan.on"]),
    ("envd process", ["aenv.envd.process.service"]),
    ("envd filesystem", ["aenv.envd.filesystem.service"]),
    ("envd http routes", ["aenv.envd.http_files", "aenv.envd.http_upload", "aenv.envd.http_misc"]),
    ("envd app + server (all of envd)",
     ["aenv.envd.__main__", "aenv.envd.app", "aenv.envd.server", "aenv.envd.sudo_server"]),
]

#: Runs inside the sandbox: argv[1] is the JSON list of steps; one JSON line per step on stdout.
_INNER = r"""
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
for i, (label, modules) in enumerate(json.loads(sys.argv[1])):
    sys.stderr.write("@@step %d\n" % i); sys.stderr.flush()
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append("%s (%s)" % (name, exc))
    sys.stderr.flush()
    print(json.dumps({"i": i, "rss_kib": rss(), "modules": len(sys.modules), "missing": missing}))
    sys.stdout.flush()
if len(sys.argv) > 2:
    maps, cur = {}, None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            cur = head[5] if len(head) > 5 else "[anon]"
        elif head and head[0] == "Rss:" and cur is not None:
            maps[cur] = maps.get(cur, 0) + int(head[1])
    print(json.dumps({"maps": maps}))
"""


@dataclass
class Step:
    label: str
    rss_kib: int
    modules: int
    import_ms: float
    missing: list[str]
    marginal_kib: int | None = None


def python_argv(bundle: Path) -> list[str]:
    lib = bundle / "lib"
    return [str(lib / "ld-linux-x86-64.so.2"), "--library-path", str(lib),
            str(bundle / "lib" / "python3"), "-P", "-S", "-s", "-B"]


def in_gvisor(bundle: Path, args: list[str], platform: str) -> tuple[str, str]:
    """Run the bundle's Python with ``args`` under ``runsc do``: (stdout, stderr)."""
    site = next((bundle / "lib").glob("python3.*")) / "site-packages"
    env = {"PYTHONHOME": str(bundle), "PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    with tempfile.TemporaryDirectory(prefix="ei-", dir="/tmp") as root:
        done = subprocess.run(
            [str(RUNSC), f"--root={root}", "--network=none", f"--platform={platform}",
             "do", "--quiet", "--cwd", "/", "--", *python_argv(bundle), *args],
            env=env, capture_output=True, text=True, check=False, timeout=300,
        )
    if done.returncode != 0:
        raise RuntimeError(f"runsc do failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout, done.stderr


def import_ms_by_step(stderr: str) -> dict[int, float]:
    """Sum of the top-level cumulative ``-X importtime`` entries between step markers."""
    per: dict[int, list[tuple[int, int]]] = {}
    step = -1
    for line in stderr.splitlines():
        if line.startswith("@@step "):
            step = int(line.split()[1])
        elif line.startswith("import time:") and step >= 0:
            parts = line.split("|")
            if len(parts) != 3 or not parts[1].strip().isdigit():
                continue
            cum, name = parts[1], parts[2]
            indent = len(name) - len(name.lstrip(" "))
            per.setdefault(step, []).append((indent, int(cum)))
    out: dict[int, float] = {}
    for i, entries in per.items():
        top = min(indent for indent, _ in entries)
        out[i] = sum(us for indent, us in entries if indent == top) / 1000
    return out


def measure(bundle: Path, platform: str, marginal: bool) -> tuple[list[Step], dict[str, int]]:
    steps_json = json.dumps(STEPS)
    stdout, stderr = in_gvisor(bundle, ["-X", "importtime", "-c", _INNER, steps_json, "maps"],
                               platform)
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    maps: dict[str, int] = next((r["maps"] for r in rows if "maps" in r), {})
    times = import_ms_by_step(stderr)
    steps = [
        Step(STEPS[r["i"]][0], r["rss_kib"], r["modules"], times.get(r["i"], 0.0), r["missing"])
        for r in rows if "i" in r
    ]
    if marginal:
        base = steps[0].rss_kib
        for i, step in enumerate(steps[1:], start=1):
            out, _ = in_gvisor(bundle, ["-c", _INNER, json.dumps([STEPS[0], STEPS[i]])], platform)
            last = [json.loads(line) for line in out.splitlines() if line.startswith("{")][-1]
            step.marginal_kib = last["rss_kib"] - base
    return steps, maps


def markdown(steps: list[Step], maps: dict[str, int], bundle: Path) -> str:
    mib = 1024
    lines = [
        f"envd's imports inside gVisor (bundle `{bundle}`), cumulative:",
        "",
        "| step | modules loaded | VmRSS MiB | +RSS MiB | import ms | alone: +RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    prev = None
    for step in steps:
        delta = "" if prev is None else f"{(step.rss_kib - prev) / mib:+.1f}"
        alone = "" if step.marginal_kib is None else f"{step.marginal_kib / mib:+.1f}"
        label = step.label + (" (absent: " + ", ".join(step.missing) + ")" if step.missing else "")
        lines.append(
            f"| {label} | {step.modules} | {step.rss_kib / mib:.1f} | {delta} | "
            f"{step.import_ms:.0f} | {alone} |"
        )
        prev = step.rss_kib
    lines += ["", "Biggest mappings after all of envd is imported (Rss inside gVisor):", "",
              "| mapping | MiB |", "|---|---:|"]
    for name, kib in sorted(maps.items(), key=lambda kv: -kv[1])[:14]:
        lines.append(f"| `{os.path.basename(name) or name}` | {kib / mib:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument("--platform", default="systrap")
    parser.add_argument("--no-marginal", action="store_true",
                        help="skip the per-step fresh-interpreter pass")
    args = parser.parse_args(argv)
    steps, maps = measure(args.bundle.resolve(), args.platform, not args.no_marginal)
    print(markdown(steps, maps, args.bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
