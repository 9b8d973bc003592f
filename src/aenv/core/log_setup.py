"""How a process of aenv logs (``log_level``, ``log_format``): text lines (ending in the
request's id when there is one), or one JSON object per line (``python-json-logger``) with
the time, level, logger, message, the request's id (``request_id.py``) and any exception,
for a log pipeline to index."""

from __future__ import annotations

import logging
import sys
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

from aenv.core.request_id import RequestIdFilter

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class _Text(logging.Formatter):
    """Text lines, ending in ``[request <id>]`` when the record is for a request."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{line} [request {rid}]" if rid else line


def formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            timestamp=False)
    return _Text(TEXT)


def configure(level: str, fmt: LogFormat = "text") -> None:
    """The root logger: ``level``, to stderr, as ``fmt``; every record with its request id."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
