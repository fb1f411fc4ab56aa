"""``acp-router status URL SESSION_ID``: one ``session/status`` question, answered on stdout.

Works against the router and against any agent that advertises the capability, over
either profile of ACP's remote transport: WebSocket (``ws://``, ``wss://``) or Streamable
HTTP (``http://``, ``https://``: ``initialize`` POSTed, the question POSTed on the
connection it opens, the answer read from the connection's event stream, then the
connection ended with ``DELETE``; docs/transport.md). Exit status: 0 active, 3 inactive,
4 unknown session (-32002), 1 anything else.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
import websockets

from router.commands.bearer import auth_headers, refusal_hint
from router.protocol import acp
from router.protocol.errors import AcpRouterError, ProtocolError
from router.protocol.jsonrpc import Params, Response, encode_request
from router.protocol.reading import parse
from router.server.links.control import INITIALIZE_PARAMS

EXIT_CODES = {"active": 0, "inactive": 3}
INITIALIZE_ID = 0
STATUS_ID = 1


class Refused(Exception):
    """The server answered the opening request with an HTTP error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".rstrip())
        self.status = status


#: one exchange with a server: the ``initialize`` answer, and the ``session/status``
#: answer (None when the server does not advertise the method)
Exchange = Callable[[str, str], Awaitable[tuple[Response, Response | None]]]


async def ask_status(url: str, session_id: str, *, time_limit: float) -> int:
    exchange = _EXCHANGES.get(urlsplit(url).scheme)
    if exchange is None:
        raise AcpRouterError(f"cannot ask {url}: expected a ws://, wss://, http:// or https:// URL")
    try:
        async with asyncio.timeout(time_limit):
            init, answer = await exchange(url, session_id)
    except Refused as exc:
        raise AcpRouterError(f"cannot ask {url}: {exc}{refusal_hint(exc.status)}") from None
    except websockets.InvalidStatus as exc:
        hint = refusal_hint(exc.response.status_code)
        raise AcpRouterError(f"cannot ask {url}: {exc}{hint}") from None
    except (
        OSError,
        TimeoutError,
        ProtocolError,
        aiohttp.ClientError,
        websockets.WebSocketException,
    ) as exc:
        raise AcpRouterError(f"cannot ask {url}: {str(exc) or type(exc).__name__}") from None
    if init.error is not None:
        print(f"initialize failed: {init.error.code}: {init.error.message}", file=sys.stderr)
        return 1
    if answer is None:
        print(f"{url} does not advertise session/status", file=sys.stderr)
        return 1
    return _report(session_id, answer)


def _report(session_id: str, answer: Response) -> int:
    if answer.error is not None:
        if answer.error.code == acp.RESOURCE_NOT_FOUND:
            print(f"{session_id}: unknown")
            return 4
        print(f"{session_id}: error {answer.error.code}: {answer.error.message}", file=sys.stderr)
        return 1
    status = answer.result.get("status") if isinstance(answer.result, dict) else None
    print(f"{session_id}: {status}")
    return EXIT_CODES.get(str(status), 3)  # an unrecognised value counts as inactive (RFD)


def _asks_status(init: Response) -> bool:
    return init.error is None and acp.has_session_capability(init.result, "status")


# -- WebSocket ------------------------------------------------------------------------------------


async def _over_websocket(url: str, session_id: str) -> tuple[Response, Response | None]:
    async with websockets.connect(url, additional_headers=auth_headers()) as ws:
        init = await _call(ws, INITIALIZE_ID, acp.INITIALIZE, INITIALIZE_PARAMS)
        if not _asks_status(init):
            return init, None
        return init, await _call(ws, STATUS_ID, acp.SESSION_STATUS, {"sessionId": session_id})


async def _call(
    ws: websockets.ClientConnection, request_id: int, method: str, params: Params
) -> Response:
    await ws.send(encode_request(request_id, method, params))
    while True:
        message = parse(await ws.recv())
        if isinstance(message, Response) and message.id == request_id:
            return message


# -- Streamable HTTP ------------------------------------------------------------------------------

JSON = {"Content-Type": "application/json"}


async def _over_http(url: str, session_id: str) -> tuple[Response, Response | None]:
    async with aiohttp.ClientSession(headers=auth_headers()) as http:
        initialize = encode_request(INITIALIZE_ID, acp.INITIALIZE, INITIALIZE_PARAMS)
        async with http.post(url, data=initialize, headers=JSON) as opened:
            if opened.status != 200:
                raise Refused(opened.status, opened.reason or "")
            connection_id = opened.headers.get(acp.CONNECTION_ID_HEADER)
            if connection_id is None:
                raise ConnectionError(f"no {acp.CONNECTION_ID_HEADER} in the answer to initialize")
            connection = {acp.CONNECTION_ID_HEADER: connection_id}
            init = _response(await opened.text())
        if not _asks_status(init):
            await _end(http, url, connection)
            return init, None
        try:
            return init, await _ask_on_stream(http, url, connection, session_id)
        finally:
            await _end(http, url, connection)


async def _ask_on_stream(
    http: aiohttp.ClientSession, url: str, connection: dict[str, str], session_id: str
) -> Response:
    """Open the connection's event stream, POST the question, read its answer there."""
    events = {**connection, "Accept": "text/event-stream"}
    async with http.get(url, headers=events) as stream:
        if stream.status != 200:
            raise Refused(stream.status, stream.reason or "")
        question = encode_request(STATUS_ID, acp.SESSION_STATUS, {"sessionId": session_id})
        async with http.post(url, data=question, headers={**connection, **JSON}) as posted:
            if posted.status != 202:
                raise Refused(posted.status, posted.reason or "")
        async for text in event_data(stream.content):
            message = parse(text)
            if isinstance(message, Response) and message.id == STATUS_ID:
                return message
    raise ConnectionError("the event stream ended before the answer")


async def _end(http: aiohttp.ClientSession, url: str, connection: dict[str, str]) -> None:
    """End the connection (``DELETE``); the answer is already in hand, so a failure to
    end it changes nothing."""
    try:
        async with http.delete(url, headers=connection):
            pass
    except aiohttp.ClientError:
        pass


def _response(text: str) -> Response:
    message = parse(text)
    if not isinstance(message, Response):
        raise ConnectionError(f"not a JSON-RPC answer: {text[:200]}")
    return message


async def event_data(lines: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined), comments skipped."""
    data: list[str] = []
    async for raw in lines:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))
        elif not line and data:
            yield "\n".join(data)
            data = []


_EXCHANGES: dict[str, Exchange] = {
    "ws": _over_websocket,
    "wss": _over_websocket,
    "http": _over_http,
    "https": _over_http,
}
