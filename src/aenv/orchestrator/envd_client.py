"""The orchestrator's side of envd: readiness, ``/init``, ``/metrics`` over the guest network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from aenv.core.errors import InvalidArgument, Unavailable
from aenv.core.net import NetSlot
from aenv.runtime.base import ENVD_PORT

#: Poll interval while waiting for a fresh envd to listen: starts small (a boot is ~100s of ms
#: to seconds) and backs off, so a slow boot does not cost the server CPU.
READY_POLL_S = 0.005
READY_POLL_MAX_S = 0.05


#: How long a pause waits for envd's answer before calling the guest unresponsive.
HEALTH_PROBE_S = 2.0


class EnvdClient:
    def __init__(self, transport: httpx.AsyncBaseTransport, slot: NetSlot) -> None:
        self._http = httpx.AsyncClient(
            transport=transport, base_url=f"http://{slot.guest_ip}:{ENVD_PORT}", timeout=10.0
        )

    async def __aenter__(self) -> EnvdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def wait_ready(self, timeout: float, *, restored: bool = False) -> None:
        """Poll until envd answers. ``restored``: the sandbox was restored from a memory image,
        so ask envd to renew its epoll instance too (``POST /restored``, envd/eventloop.py)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        pause = READY_POLL_S
        while time.monotonic() < deadline:
            try:
                if restored:
                    response = await self._http.post("/restored", timeout=1.0)
                    if response.status_code in (404, 405):  # an envd older than /restored
                        response = await self._http.get("/health", timeout=1.0)
                else:
                    response = await self._http.get("/health", timeout=1.0)
                if response.status_code == 204:
                    return
            except httpx.HTTPError as exc:
                last = exc
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, READY_POLL_MAX_S)
        raise Unavailable(f"envd did not become ready within {timeout:.0f}s ({last})")

    async def healthy(self, timeout: float = HEALTH_PROBE_S) -> bool:
        """One ``GET /health``: does envd answer now?"""
        try:
            response = await self._http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return response.status_code == 204

    async def init(
        self, *, token: str, env_vars: dict[str, str], user: str, workdir: str | None,
        current_token: str | None = None, renew_boot_id: bool = False,
        volume_mounts: list[dict[str, object]] | None = None,
        trust_certificates: list[str] | None = None,
    ) -> None:
        """Hand envd its identity. ``workdir`` None: leave envd's as it is (none, for a
        template without WORKDIR: each user's home). ``current_token``: the token envd already
        holds (a sandbox restored from another one's memory), which authorises the change.
        ``renew_boot_id``: a new sandbox, not the continuation of the boot its memory image was
        saved from, so it gets a boot id of its own (envd/bootid.py). ``volume_mounts``: the
        volume slots to bind where they belong (envd/volume_binds.py); a path the image
        cannot take (a file there) is ``InvalidArgument``. ``trust_certificates``: CAs the
        sandbox's clients trust from now on (envd/trust_store.py)."""
        try:
            response = await self._post_init(
                token, env_vars, user, workdir, current_token, renew_boot_id,
                volume_mounts or [], trust_certificates or [],
            )
        except httpx.HTTPError as exc:
            raise Unavailable(f"envd /init failed: {exc!r}") from exc
        if response.status_code == 400 and volume_mounts:
            raise InvalidArgument(_message(response))
        if response.status_code != 204:
            raise Unavailable(f"envd /init failed: {response.status_code} {response.text}")

    async def _post_init(
        self, token: str, env_vars: dict[str, str], user: str, workdir: str | None,
        current_token: str | None, renew_boot_id: bool, volume_mounts: list[dict[str, object]],
        trust_certificates: list[str],
    ) -> httpx.Response:
        body: dict[str, Any] = {"accessToken": token, "envVars": env_vars, "defaultUser": user}
        if volume_mounts:
            body["volumeMounts"] = volume_mounts
        if trust_certificates:
            body["trustCertificates"] = trust_certificates
        if workdir:
            body["defaultWorkdir"] = workdir
        if renew_boot_id:
            body["renewBootId"] = True
        return await self._http.post(
            "/init", json=body, headers={"X-Access-Token": current_token or token}
        )

    async def trust(self, token: str, certificates: list[str]) -> None:
        """Have a running sandbox trust ``certificates`` as well (envd/trust_store.py)."""
        try:
            response = await self._http.post("/init", json={"trustCertificates": certificates},
                                             headers={"X-Access-Token": token})
        except httpx.HTTPError as exc:
            raise Unavailable(f"envd /init failed: {exc!r}") from exc
        if response.status_code != 204:
            raise Unavailable(f"envd /init failed: {response.status_code} {response.text}")

    async def metrics(self, token: str) -> dict[str, Any]:
        response = await self._http.get("/metrics", headers={"X-Access-Token": token})
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["message"])
    except (ValueError, KeyError, TypeError):
        return response.text
