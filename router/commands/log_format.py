"""How the commands log: plain text lines, or one JSON object per line (``--log-format``).

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, then the
``connection``, ``backend`` and ``session`` the record is about (when known, see
:mod:`router.server.log_context`) and any ``outcome`` a call passed in ``extra``, then
``exception`` with the traceback when there is one. Messages never carry prompt text.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from router.server.log_context import FIELDS, ContextFilter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in (*FIELDS, "outcome"):
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, log_format: str) -> None:
    """Send the process's log records to stderr, as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler])
