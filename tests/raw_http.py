"""Raw HTTP/1.1 on a socket, for what aiohttp's client will not do: announce a body and
hold it, send headers aiohttp would refuse, read an answer while still writing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support import WAIT


def raw_post(connection_id: str, length: int, token: str | None = None) -> bytes:
    """The head of a POST /acp of a ``length``-byte JSON body (sent apart)."""
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return (
        f"POST /acp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Acp-Connection-Id: {connection_id}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def status_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP answer's status and headers, read from ``reader``."""
    async with asyncio.timeout(WAIT):
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := (await reader.readline()).decode().strip()) != "":
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


@contextlib.asynccontextmanager
async def raw_connection(
    url: str,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").removesuffix("/acp").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()


async def post_body(
    url: str, head: bytes, size: int, *, hold_last: bool = False
) -> tuple[int, dict[str, str]]:
    """POST ``size`` bytes after ``head`` (all but the last one, when ``hold_last``: the
    body is held unfinished, and the answer comes only if it is refused); the answer."""
    async with raw_connection(url) as (reader, writer):
        answer = asyncio.create_task(status_of(reader))
        sent, end = 0, size - hold_last
        chunk = b"{" * (1024 * 1024)
        with contextlib.suppress(ConnectionError):
            writer.write(head)
            while sent < end and not answer.done():
                writer.write(chunk[: end - sent])
                sent += min(len(chunk), end - sent)
                await writer.drain()
        try:
            return await answer
        finally:
            answer.cancel()
