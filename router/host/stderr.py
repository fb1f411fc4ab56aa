"""The last lines an agent wrote to stderr, sans-I/O: what the host tells a client about
why a session could not start, or why the agent died.

Agents log to stderr (ACP's stdio transport reserves stdout for messages), and that is
where the real reason for a refusal usually is: an agent that answers ``session/new``
with "Query closed before response received" has just written why to stderr. The I/O
shell passes every byte on to the host's own stderr and feeds them here; this keeps the
last :data:`KEPT_LINES` lines (each cut to :data:`MAX_LINE_CHARS`) and counts them all,
so a request can be told what was written after it went to the agent.
"""

from __future__ import annotations

from collections import deque
from typing import Final

#: lines remembered
KEPT_LINES: Final = 20
#: a longer line is kept cut to this many characters (its end)
MAX_LINE_CHARS: Final = 1000
#: lines put in one error's ``data.agentStderr``
REPORTED_LINES: Final = 5


class StderrTail:
    """The last lines of one agent process's stderr."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)
        self._partial = bytearray()
        #: complete lines seen so far (forgotten ones included)
        self.count = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes the agent wrote."""
        self._partial += chunk
        *lines, rest = self._partial.split(b"\n")
        for line in lines:
            self._add(line)
        self._partial = bytearray(rest[-4 * MAX_LINE_CHARS :])

    def end(self) -> None:
        """The stream ended: a last line without a newline counts too."""
        if self._partial:
            self._add(self._partial)
            self._partial.clear()

    def since(self, mark: int) -> str | None:
        """The last non-blank lines among those written after the first ``mark``, joined
        with newlines; None when there are none (or none is remembered)."""
        fresh = min(self.count - mark, len(self._lines))
        if fresh <= 0:
            return None
        lines = [line for line in list(self._lines)[-fresh:] if line.strip()]
        return "\n".join(lines[-REPORTED_LINES:]) or None

    def last(self) -> str | None:
        """The last non-blank lines remembered (see :meth:`since`)."""
        return self.since(0)

    def _add(self, line: bytes | bytearray) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        self._lines.append(text[-MAX_LINE_CHARS:])
        self.count += 1
