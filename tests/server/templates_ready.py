"""Wait for a template a node builds by itself (the code-interpreter one) to be ready."""

from __future__ import annotations

import time

import httpx

from tests.server.harness import API_KEY, NodeServer


class TemplateBuildFailed(AssertionError):
    pass


def template(server: NodeServer, name: str) -> dict[str, object] | None:
    response = httpx.get(f"{server.url}/templates", headers={"X-API-Key": API_KEY}, timeout=30)
    response.raise_for_status()
    return next((t for t in response.json()
                 if name in [*t.get("names", []), *t.get("aliases", [])]), None)


def build_log(server: NodeServer, found: dict[str, object]) -> str:
    response = httpx.get(
        f"{server.url}/templates/{found['templateID']}/builds/{found['buildID']}/status",
        headers={"X-API-Key": API_KEY}, params={"logsOffset": 0}, timeout=30)
    return response.text[-4000:]


def wait_ready(server: NodeServer, name: str, within_s: float) -> None:
    """Until ``name``'s newest build is ready; ``TemplateBuildFailed`` with its log if it
    failed, ``AssertionError`` past ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        found = template(server, name)
        status = found.get("buildStatus") if found else None
        if status == "ready":
            return
        if status == "error" and found is not None:
            raise TemplateBuildFailed(f"the {name} build failed:\n{build_log(server, found)}")
        assert time.monotonic() < deadline, f"{name} not built within {within_s} s"
        time.sleep(2)
