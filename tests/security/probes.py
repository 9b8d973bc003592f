"""What the escape tests run inside a sandbox, and what they look up on the host."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from e2b import Sandbox

from tests.network.peers import PROBE
from tests.server.harness import NodeServer

#: Blocked traffic is dropped, not refused: a probe waits this long before calling it blocked.
PROBE_TIMEOUT_S = 2.0


def probe(sbx: Sandbox, *targets: str) -> dict[str, str]:
    """Connect from inside ``sbx`` to each ``host:port`` at once: "connected", "timeout" or
    the exception's name (e.g. "ConnectionRefusedError": the sandbox's own loopback)."""
    sbx.files.write("/tmp/probe.py", PROBE)
    out = sbx.commands.run(
        f"python3 /tmp/probe.py {PROBE_TIMEOUT_S} {' '.join(targets)}", timeout=30
    ).stdout
    result: dict[str, str] = json.loads(out)
    return result


def _ip_json(*argv: str) -> list[dict[str, Any]]:
    out = subprocess.run(["ip", "-j", *argv], check=True, capture_output=True, text=True)
    data: list[dict[str, Any]] = json.loads(out.stdout or "[]")
    return data


def host_addresses() -> list[str]:
    """Every IPv4 address of the host (its veths to the test peers included), and the host end
    of every slot's veth."""
    found = {"169.254.0.22"}
    for link in _ip_json("-4", "addr"):
        for addr in link.get("addr_info", []):
            if not str(addr.get("local", "")).startswith("127."):
                found.add(addr["local"])
    return sorted(found)


def return_addresses(server: NodeServer) -> list[str]:
    """The return addresses of the node's slots (host routes via the guest address)."""
    first = int(server.env["AENV_NET_FIRST_INDEX"])
    last = int(server.env["AENV_NET_LAST_INDEX"])
    found = []
    for route in _ip_json("-4", "route", "show", "via", "169.254.0.21"):
        dev = str(route.get("dev", ""))
        if dev.startswith("aenv-h") and first <= int(dev[6:]) <= last:
            found.append(str(route["dst"]))
    return found
