"""Connect calls sent raw with httpx (no SDK): the floor under the SDK's numbers.

The node benchmark sends the same requests through its proxy.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import httpx

from bench.envd_bench.common import END_STREAM_OK, ROOT_AUTH


def envelope(message: dict[str, Any]) -> bytes:
    """One Connect stream envelope: flags 0, big-endian length, JSON."""
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def raw_start(client: httpx.Client, cmd: str, args: list[str], *, root: bool) -> Callable[[], None]:
    """A callable that runs ``cmd`` through a raw ``Start`` stream and checks it ended cleanly.

    Sends what the SDK sends for ``commands.run`` (stdin off, 60 s Connect timeout, keepalive
    header), so the difference to the SDK number is the SDK's own client cost.
    """
    body = envelope({"process": {"cmd": cmd, "args": args, "envs": {}}, "stdin": False})
    headers = {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": "60000",
        "keepalive-ping-interval": "50",
    }
    if root:
        headers["authorization"] = ROOT_AUTH

    def call() -> None:
        response = client.post("/process.Process/Start", content=body, headers=headers)
        content = response.content
        if response.status_code != 200 or not content.endswith(END_STREAM_OK):
            raise RuntimeError(f"Start {cmd} failed: {response.status_code} {content[-200:]!r}")
        if b'"exitCode"' in content:  # proto3 JSON omits a zero exit code
            raise RuntimeError(f"Start {cmd} exited non-zero: {content[-200:]!r}")

    return call


def raw_unary_list(client: httpx.Client) -> Callable[[], None]:
    headers = {"content-type": "application/json", "connect-protocol-version": "1"}

    def call() -> None:
        response = client.post("/process.Process/List", content=b"{}", headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"List failed: {response.status_code} {response.text[:200]}")

    return call


def raw_health(client: httpx.Client) -> Callable[[], None]:
    def call() -> None:
        if (status := client.get("/health").status_code) != 204:
            raise RuntimeError(f"/health answered {status}")

    return call
