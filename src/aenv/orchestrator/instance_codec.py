"""Runtime instances <-> the JSON kept in the store (the store knows no runtime types)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from aenv.core.net import NetSlot
from aenv.runtime.base import Instance


def slot_to_json(slot: NetSlot) -> dict[str, Any]:
    return asdict(slot)


def slot_from_json(data: dict[str, Any]) -> NetSlot:
    return NetSlot(**data)


def instance_json(
    slot: NetSlot, instance: Instance | None, *, envd_bundle: Path | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {"slot": slot_to_json(slot)}
    if instance is not None:
        data["runtime_id"] = instance.runtime_id
        data["pid"] = instance.pid
    if envd_bundle is not None:
        data["envd_bundle"] = str(envd_bundle)
    return data


def frozen(data: dict[str, Any] | None) -> bool:
    """Paused in memory (runtime frozen, slot held), not yet written to disk."""
    return bool(data and data.get("frozen"))


def paused_image(data: dict[str, Any] | None) -> Path | None:
    """The memory image of a sandbox paused to disk (nothing runs; a runtime sandbox and a
    slot only when it is :func:`ready_to_resume`)."""
    return Path(data["image"]) if data and data.get("image") else None


def ready_to_resume(data: dict[str, Any] | None) -> bool:
    """Paused to disk with a runtime sandbox created ahead on its files, not started
    (``orchestrator/resume_ready.py``): its resume restores into that one."""
    return bool(data and data.get("image") and data.get("slot") and data.get("runtime_id"))


def envd_bundle_of(data: dict[str, Any] | None, default: Path) -> Path:
    """The envd bundle the sandbox runs (a restore must mount the same one)."""
    return Path(data["envd_bundle"]) if data and data.get("envd_bundle") else default


def decode(data: dict[str, Any] | None, sandbox_id: str) -> tuple[NetSlot | None, Instance | None]:
    if not data:
        return None, None
    slot = slot_from_json(data["slot"]) if data.get("slot") else None
    instance = None
    if slot is not None and data.get("runtime_id"):
        instance = Instance(sandbox_id, data["runtime_id"], data.get("pid"), slot)
    return slot, instance
