"""How the commands log: plain text lines, or one JSON object per line (``--log-format``).

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, then the
``connection``, ``backend`` and ``session`` the record is about (when known, see
:mod:`router.server.observability.log_context`) and any ``outcome`` a call passed in ``extra`` (with a
request log line's ``method``, ``duration_ms``, ``error_code``, ``trace_id`` and
``span_id``: :mod:`router.server.connection.request_log`), then ``exception`` with the traceback
when there is one. Messages never carry prompt text.
A worker of a router with ``router.workers`` above 1 names itself in every line: ``worker
1`` after the level in text, ``"worker": 1`` in JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from router.server.observability.log_context import FIELDS, ContextFilter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: what a call may pass in ``extra`` for the JSON line, after the context's fields (the
#: request log's, and ``outcome`` from any record)
REQUEST_FIELDS = ("method", "duration_ms", "outcome", "error_code", "trace_id", "span_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; ``worker``: the worker's index, if any."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            line["worker"] = self.worker
        for name in (*FIELDS, *REQUEST_FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, log_format: str, worker: int | None = None) -> None:
    """Send the process's log records to stderr, as text or JSON lines; ``worker``: this
    process is that worker of a router's (named in each line)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    text = (
        TEXT_FORMAT
        if worker is None
        else TEXT_FORMAT.replace(" %(name)s", f" worker {worker} %(name)s")
    )
    handler.setFormatter(JsonFormatter(worker) if log_format == "json" else logging.Formatter(text))
    logging.basicConfig(level=level, handlers=[handler])
