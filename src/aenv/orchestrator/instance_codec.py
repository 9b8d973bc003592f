"""Runtime instances <-> the JSON kept in the store (the store knows no runtime types)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aenv.network.base import NetSlot
from aenv.runtime.base import Instance


def slot_to_json(slot: NetSlot) -> dict[str, Any]:
    return asdict(slot)


def slot_from_json(data: dict[str, Any]) -> NetSlot:
    return NetSlot(**data)


def instance_json(slot: NetSlot, instance: Instance | None) -> dict[str, Any]:
    data: dict[str, Any] = {"slot": slot_to_json(slot)}
    if instance is not None:
        data["runtime_id"] = instance.runtime_id
        data["pid"] = instance.pid
    return data


def decode(data: dict[str, Any] | None, sandbox_id: str) -> tuple[NetSlot | None, Instance | None]:
    if not data:
        return None, None
    slot = slot_from_json(data["slot"]) if data.get("slot") else None
    instance = None
    if slot is not None and data.get("runtime_id"):
        instance = Instance(sandbox_id, data["runtime_id"], data.get("pid"), slot)
    return slot, instance
