"""The garbage collector's pure plan, row by row (storage/gc.py)."""

from __future__ import annotations

import datetime

from aenv.storage.gc import plan_collection
from aenv.storage.objects import ObjectInfo

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def info(key: str, age_s: float, size: int = 10) -> ObjectInfo:
    return ObjectInfo(key, size, NOW - datetime.timedelta(seconds=age_s))


def key(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def test_referenced_blobs_stay_whatever_their_age() -> None:
    plan = plan_collection([info(key(A), 1e6)], {A}, now=NOW, grace_s=60)
    assert plan.delete == () and plan.kept_referenced == 1


def test_unreferenced_recent_blobs_stay() -> None:
    plan = plan_collection([info(key(A), 10)], set(), now=NOW, grace_s=60)
    assert plan.delete == () and plan.kept_young == 1


def test_unreferenced_old_blobs_go_and_count_their_bytes() -> None:
    plan = plan_collection([info(key(A), 61, 5), info(key(B), 120, 7)], set(), now=NOW,
                           grace_s=60)
    assert plan.delete == (key(A), key(B)) and plan.freed_bytes == 12


def test_old_temporaries_under_blobs_go_young_ones_stay() -> None:
    old = info("blobs/sha256/.tmp.abc", 100)
    young = info("blobs/sha256/.tmp.def", 1)
    plan = plan_collection([old, young], set(), now=NOW, grace_s=60)
    assert plan.delete == (old.key,)


def test_objects_outside_blobs_are_never_touched() -> None:
    plan = plan_collection([info("manifests/x.json", 1e6), info("other/y", 1e6)], set(),
                           now=NOW, grace_s=0)
    assert plan.delete == ()
