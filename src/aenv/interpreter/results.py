"""Jupyter messages → the output lines the SDK parses (`models.py: _parse_output`).

Owns the wire shape of every line `POST /execute` streams:
    {"type": "stdout"|"stderr", "text", "timestamp"}     a stream message (ISO timestamp)
    {"type": "result", "text", "html", ..., "is_main_result", "extra"}   a mime bundle
    {"type": "error", "name", "value", "traceback"}      the kernel's error message
    {"type": "number_of_executions", "execution_count"}
    {"type": "end_of_execution"}                         always last
    {"type": "keepalive"}                                ignored by the SDKs (see streaming.py)
and nothing about kernels or HTTP.
"""

from __future__ import annotations

import datetime
from typing import Any

# Jupyter mime type → the SDK's Result field. Anything else goes to `extra`.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    # Set by the formatters ipython_startup.py registers (E2B's template uses the same names).
    "e2b/data": "data",
    "e2b/chart": "chart",
}
# The mime types a kernel sends alongside others that mean nothing to a client.
DROPPED_MIMES = frozenset({"application/vnd.jupyter.widget-view+json"})

Line = dict[str, Any]


def timestamp(msg: dict[str, Any]) -> str:
    """The message's own time (its header date) in ISO 8601, else now."""
    date = msg.get("header", {}).get("date")
    if isinstance(date, datetime.datetime):
        return date.isoformat()
    if isinstance(date, str) and date:
        return date
    return datetime.datetime.now(datetime.UTC).isoformat()


def _strip_quotes(text: str) -> str:
    # E2B's server strips the quotes from a string's repr ('abc' → abc), and SDK users compare
    # `execution.text` against the bare string, so do the same.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result_line(bundle: dict[str, Any], *, is_main_result: bool) -> Line:
    """A `result` line from a display_data / execute_result mime bundle."""
    line: Line = {"type": "result", "is_main_result": is_main_result}
    extra: dict[str, Any] = {}
    for mime, value in bundle.items():
        field = MIME_FIELDS.get(mime)
        if field is not None:
            line[field] = value
        elif mime not in DROPPED_MIMES:
            extra[mime] = value
    if isinstance(line.get("text"), str):
        line["text"] = _strip_quotes(line["text"])
    if not line.get("chart"):
        # A figure with nothing to extract carries an empty chart: absent, as E2B sends it.
        line.pop("chart", None)
    if extra:
        line["extra"] = extra
    return line


def stream_line(msg: dict[str, Any]) -> Line:
    """A `stdout` / `stderr` line from a `stream` message."""
    content = msg["content"]
    name = "stderr" if content.get("name") == "stderr" else "stdout"
    return {"type": name, "text": content.get("text", ""), "timestamp": timestamp(msg),
            "error": name == "stderr"}


def error_line(content: dict[str, Any]) -> Line:
    """An `error` line from an `error` message or an error execute_reply."""
    traceback = content.get("traceback") or []
    text = "\n".join(traceback) if isinstance(traceback, list) else str(traceback)
    return {"type": "error", "name": str(content.get("ename", "")),
            "value": str(content.get("evalue", "")), "traceback": text}


def synthetic_error(name: str, value: str) -> Line:
    """An `error` line for what went wrong around the kernel (it died, it was restarted)."""
    return {"type": "error", "name": name, "value": value, "traceback": ""}


def count_line(execution_count: int) -> Line:
    return {"type": "number_of_executions", "execution_count": execution_count}


END_OF_EXECUTION: Line = {"type": "end_of_execution"}
KEEPALIVE: Line = {"type": "keepalive"}
