"""A gateway's calls to a scheduler (``scheduler.py``): place, then commit or cancel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from starlette.responses import Response

from aenv.edge.errors import error_body

#: Headers of a scheduler's refusal that the gateway's caller must see (429's Retry-After).
_PASSED = ("content-type", "retry-after")


class SchedulerClient:
    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url.rstrip("/")

    async def place(self, **want: Any) -> list[dict[str, Any]] | Response:
        """The placements for ``want`` (``PlacementRequest``'s fields by their JSON names),
        or the scheduler's refusal (429 cluster_full, 503 no_nodes; 503 when it cannot be
        reached) as the answer to give."""
        try:
            placed = await self.http.post(f"{self.url}/v1/placements", json=want)
        except httpx.TransportError as exc:
            # Not the gateway's 500: the caller may try again (another replica may answer).
            return error_body(503, f"the scheduler at {self.url} cannot be reached: "
                                   f"{type(exc).__name__}", {"Retry-After": "1"})
        if placed.status_code != 201:
            return Response(placed.content, status_code=placed.status_code,
                            headers={k: v for k, v in placed.headers.items()
                                     if k.lower() in _PASSED})
        placements: list[dict[str, Any]] = placed.json()["placements"]
        return placements

    async def settle(self, reservation: str, *, commit: bool,
                     sandbox_ids: Sequence[str] = ()) -> None:
        """Commit (``sandbox_ids`` started) or cancel a reservation; a scheduler that cannot
        be reached is no error: the reservation expires on its own (``reserve.py``)."""
        url = f"{self.url}/v1/reservations/{reservation}"
        try:
            if commit:
                await self.http.post(url + "/commit", json={"sandboxIDs": list(sandbox_ids)})
            else:
                await self.http.delete(url)
        except httpx.TransportError:
            pass
