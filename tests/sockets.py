"""Stand-ins around the router's WebSocket (:class:`router.server.links.websocket.WebSocket`)
for tests that feed it bytes by hand: a transport that keeps what is written, and a
receiver that keeps nothing unless told."""

from __future__ import annotations

import asyncio
from typing import Any


class KeptTransport(asyncio.Transport):
    """A transport whose writes are kept in :attr:`written` (``<eof>`` for a half-close)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.written += b"<eof>"

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Receiver:
    """A WebSocket's receiver that does nothing with binary frames, drains and the end,
    and raises a handler's failure; subclasses say what a text message does."""

    def received_binary(self) -> None:
        pass

    def handling_failed(self, exc: Exception) -> None:
        raise exc

    def writable(self) -> None:
        pass

    def closed(self) -> None:
        pass
