"""What the parts of the image benchmark share: the node under test, the images it serves,
control over what the node has cached, and disk usage.

The node is a real server (``tests/server/harness.py``) with ``AENV_WARM_POOL_SIZE=0`` (every
create is a plain boot or restore, and nothing refills a pool in the background of a timed
run) and a **private layer store**: a fresh directory holding only a hard-linked copy of the
test cache's ``base`` template layer (so the node does not build one). The shared test cache
(``/var/cache/aenv-test/layers``) is never written: the layers this benchmark unpacks and
builds, and the ones it deletes to make an image uncached again, are its own.

"Uncached" means: the node's image records (``<home>/images``), its blob store
(``<home>/blobs``) and the image's unpacked layers (``<layers>/<diff_id>``) are deleted while
no sandbox uses them, so the next cold start pulls and unpacks everything again, exactly as a
node that never saw the image. The registry is a real ``docker-registry`` on loopback
(``tests/registry.py``) holding the ready-made test images (``tests/images.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# Network slots of this benchmark's node (disjoint from other users of the machine); set before
# lifecycle_bench is imported, which defaults it to its own range.
os.environ.setdefault("AENV_TEST_SLOT_BASE", "44000")

import httpx
from tests.conftest import free_port
from tests.images import BuiltImage, base_template_layer
from tests.registry import Registry
from tests.server.harness import API_KEY, start_server

from aenv.core.settings import Settings
from bench.lifecycle_bench import LifecycleNode, Report, log
from bench.node_bench.common import CGROUP_ROOT, NODE_CGROUP, ms_since

#: The image store's log lines (storage/images.py): the line's timestamp (ms) and the
#: duration it states (seconds with one decimal).
STAMP = r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"
PULLED_RE = re.compile(
    STAMP + r"pulled (?P<ref>\S+) \((?P<digest>\S+), (?P<layers>\d+) layers\) in (?P<s>[\d.]+) s"
)
UNPACKED_RE = re.compile(
    STAMP + r"unpacked layer (?P<id>[0-9a-f]{12}) of (?P<ref>\S+) \((?P<mb>[\d.]+) MB, "
    r"(?P<entries>\d+) entries\) in (?P<s>[\d.]+) s"
)
#: A cold start or build on 2 busy cores can take longer than httpx's default timeout.
REQUEST_TIMEOUT_S = 600.0
DEFAULT_CPU = int(Settings.model_fields["default_cpu_count"].default)
DEFAULT_MEMORY_MB = int(Settings.model_fields["default_memory_mb"].default)
MIB = 1 << 20


@dataclass(frozen=True)
class TestImage:
    """A ready-made test image pushed to the benchmark's registry."""

    name: str
    ref: str
    built: BuiltImage

    @property
    def layer_ids(self) -> tuple[str, ...]:
        """Layer store ids of its layers (the diff_id hex), lowest first."""
        return tuple(layer.diff_id.partition(":")[2] for layer in self.built.layers)

    @property
    def blob_bytes(self) -> int:
        return sum(layer.size for layer in self.built.layers)


@dataclass
class ImagesNode(LifecycleNode):
    """The node under test: lifecycle_bench's log readers plus cold starts."""

    layers_dir: Path = field(default_factory=Path)

    def cold_start(self, image: str, **extra: Any) -> tuple[str, float]:
        """``POST /sandboxes-cold``: the new sandbox's id and the request's wall ms."""
        start = time.perf_counter()
        response = httpx.post(
            f"{self.server.url}/sandboxes-cold",
            json={"image": image, **extra},
            headers={"X-API-KEY": API_KEY},
            timeout=REQUEST_TIMEOUT_S,
        )
        elapsed = ms_since(start)
        if response.status_code != 201:
            raise RuntimeError(f"cold start of {image}: {response.status_code} {response.text}")
        return str(response.json()["sandboxID"]), elapsed

    def kill(self, sandbox_id: str) -> None:
        from e2b import Sandbox

        with contextlib.suppress(Exception):
            Sandbox.kill(sandbox_id, **self.opts())

    def layer(self, layer_id: str) -> Path:
        return self.layers_dir / layer_id


@dataclass
class Bench:
    """Everything a part needs."""

    report: Report
    node: ImagesNode
    registry: Registry
    images: dict[str, TestImage]
    #: Scratch space of this run (bare pulls, copies of layers, the build context).
    scratch: Path
    #: The name of the template the build part makes (the create and disk parts use it).
    template: str = "ib-build"
    template_ready: bool = False


def private_layer_store() -> Path:
    """A fresh layer store holding a hard-linked copy of the test cache's ``base`` layer."""
    base = base_template_layer()
    if base is None:
        raise RuntimeError(
            "no base template layer in the test cache yet: start any test server once "
            "(e.g. `make test`), it builds one"
        )
    root = Path(tempfile.mkdtemp(prefix="ib-layers-", dir="/tmp"))
    link_copy(base, root / base.name)
    shutil.copy(base.with_name(base.name + ".json"), root / f"{base.name}.json")
    return root


def link_copy(src: Path, dest: Path) -> None:
    """A copy of the tree ``src`` at ``dest`` sharing its files (hard links; a real copy if
    they are on different filesystems). Layers are never written, so sharing is safe."""
    done = subprocess.run(["cp", "-al", str(src), str(dest)], capture_output=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(dest)], check=True)


def start_node(layers_dir: Path) -> ImagesNode:
    started = time.perf_counter()
    server = start_server(free_port(), None, layers_dir=str(layers_dir), warm_pool_size="0")
    first = int(server.env["AENV_NET_FIRST_INDEX"])
    last = int(server.env["AENV_NET_LAST_INDEX"])
    node = ImagesNode("images", server, 0, (first, last), layers_dir=layers_dir)
    log(
        f"node on {server.url} (slots {first}-{last}, home {server.home}, layers {layers_dir}) "
        f"up in {ms_since(started):.0f} ms"
    )
    return node


def uncache(node: ImagesNode, image: TestImage) -> None:
    """Make the node forget ``image``: records, blobs and unpacked layers (no sandbox may use
    them). Blobs of every image go: only one image is pulled at a time here."""
    home = node.server.home
    shutil.rmtree(home / "images", ignore_errors=True)
    shutil.rmtree(home / "blobs", ignore_errors=True)
    for layer_id in image.layer_ids:
        shutil.rmtree(node.layer(layer_id), ignore_errors=True)
        node.layer(layer_id).with_name(f"{layer_id}.json").unlink(missing_ok=True)


def wait_unmounted(home: Path, sandbox_id: str, timeout_s: float = 15.0) -> bool:
    """Wait until the sandbox's rootfs is no longer mounted (in our mount namespace)."""
    needle = f"{home}/sandboxes/{sandbox_id}/"
    deadline = time.monotonic() + timeout_s
    while needle in Path("/proc/self/mountinfo").read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def du_bytes(*paths: Path) -> int:
    """Disk used by ``paths`` together (allocated blocks, each inode once, not crossing into
    mounts such as a sandbox's merged rootfs: ``du -sxcB1``)."""
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return 0
    done = subprocess.run(
        ["du", "-s", "-x", "-c", "-B1", *existing], capture_output=True, text=True, check=False
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1].split()[0]) if lines else 0


def memcg_bytes(sandbox_id: str) -> int | None:
    """The memory cgroup's usage of one node sandbox (v1 ``memory.usage_in_bytes``)."""
    path = CGROUP_ROOT / "memory" / NODE_CGROUP / sandbox_id / "memory.usage_in_bytes"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def seconds_ms(values: list[str]) -> list[float]:
    """Log values in seconds (one decimal) as ms."""
    return [float(v) * 1000 for v in values]


def log_time(stamp: str) -> float:
    """A node log line's timestamp (local time, ms resolution) as Unix time."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
