"""Just enough of the Connect wire format to check envd's framing byte by byte in tests."""

from __future__ import annotations

import json
import struct
from typing import Any

END_STREAM = 0x02


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(body)) + body


def parse_envelopes(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    frames: list[tuple[int, dict[str, Any]]] = []
    offset = 0
    while offset < len(data):
        flags, length = struct.unpack_from(">BI", data, offset)
        offset += 5
        frames.append((flags, json.loads(data[offset : offset + length])))
        offset += length
    assert offset == len(data), "trailing bytes after the last envelope"
    return frames


STREAM_HEADERS = {"content-type": "application/connect+json", "connect-protocol-version": "1"}
UNARY_HEADERS = {"content-type": "application/json", "connect-protocol-version": "1"}
