"""What a log line is about: the client connection, backend and session in context.

The shell sets these context variables where a piece of work starts (a client
connection's handler, a backend link's task, a locate), and asyncio copies them into
every task started from there, so any log record made inside carries them without each
call passing them along. :class:`ContextFilter` copies them onto the record, for the JSON
log format (``--log-format json``) to print. Prompt text never goes in a log record.
"""

from __future__ import annotations

import itertools
import logging
from contextvars import ContextVar

connection: ContextVar[int | None] = ContextVar("connection", default=None)
backend: ContextVar[str | None] = ContextVar("backend", default=None)
session: ContextVar[str | None] = ContextVar("session", default=None)

_connection_ids = itertools.count(1)

#: the record attributes :class:`ContextFilter` sets, in the order the JSON format prints them
FIELDS = ("connection", "backend", "session")


def new_connection() -> int:
    """Number a new client connection and make it the context of what follows."""
    number = next(_connection_ids)
    connection.set(number)
    return number


class ContextFilter(logging.Filter):
    """Copy the context variables onto every record (as ``connection``, ``backend``,
    ``session``), unless the call already passed them in ``extra`` (None included: a
    request log line about no session says so, whatever session the task is about)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in (("connection", connection), ("backend", backend), ("session", session)):
            if name not in record.__dict__:
                setattr(record, name, var.get())
        return True
