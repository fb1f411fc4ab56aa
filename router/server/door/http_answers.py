"""The plain-text answers of the Streamable HTTP door (:mod:`router.server.door.streamable_http`)."""

from __future__ import annotations

from aiohttp import web


def text_response(status: int, text: str) -> web.Response:
    """A plain-text answer of one line."""
    return web.Response(status=status, text=text + "\n")
