"""The ``repository`` setting → a location: a directory path or ``s3://BUCKET[/PREFIX]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.core.errors import InvalidArgument
from aenv.storage.objects import PosixLocation, S3Location, parse_location

S3: dict[str, str | bool] = {
    "endpoint": "http://127.0.0.1:9000",
    "region": "eu-west-1",
    "access_key_id": "AKIDEXAMPLE",
    "secret_access_key": "wJalrXUtnFEMI-do-not-log",
    "allow_http": True,
    "virtual_hosted": False,
}


@pytest.mark.parametrize("value", ["/srv/aenv/repository", "/", "/mnt/nfs/aenv/"])
def test_a_directory(value: str) -> None:
    location = parse_location(value, s3=S3)
    assert location == PosixLocation(kind="posix_fs", root=Path(value))
    assert location.describe() == str(Path(value))


@pytest.mark.parametrize(
    ("value", "bucket", "prefix"),
    [
        ("s3://bucket/snapshots", "bucket", "snapshots"),
        ("s3://bucket/a/b/c/", "bucket", "a/b/c"),
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1//deep//", "my.bucket-1", "deep"),
    ],
)
def test_an_s3_url(value: str, bucket: str, prefix: str) -> None:
    location = parse_location(value, s3=S3)
    assert isinstance(location, S3Location)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert location.endpoint == S3["endpoint"] and location.region == "eu-west-1"
    assert location.access_key_id == "AKIDEXAMPLE" and location.allow_http is True
    assert location.describe() == f"s3://{bucket}/{prefix} at http://127.0.0.1:9000"


def test_s3_options_left_unset_take_the_defaults() -> None:
    location = parse_location("s3://bucket/p", s3={"endpoint": None, "region": None})
    assert location == S3Location(kind="s3", bucket="bucket", prefix="p")
    assert parse_location("s3://bucket/p") == location
    assert location.describe() == "s3://bucket/p"


def test_the_secret_key_stays_out_of_repr() -> None:
    location = parse_location("s3://bucket/p", s3=S3)
    assert isinstance(location, S3Location)
    assert location.secret_access_key == S3["secret_access_key"]
    secret = str(S3["secret_access_key"])
    assert secret not in repr(location) and secret not in location.describe()


@pytest.mark.parametrize(
    "value",
    [
        "relative/path",
        "repository",
        "./repo",
        "../repo",
        "",
        "~/repo",
        "s3://",
        "s3:///prefix-without-bucket",
        "gs://bucket/p",
        "http://host/bucket",
        "file:///srv/repo",
    ],
)
def test_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="repository"):
        parse_location(value, s3=S3)
