"""``acp-router status URL SESSION_ID``: one ``session/status`` question, answered on stdout.

Works against the router and against any agent that advertises the capability. Exit
status: 0 active, 3 inactive, 4 unknown session (-32002), 1 anything else.
"""

from __future__ import annotations

import asyncio
import sys

import websockets

from router.commands.bearer import auth_headers, refusal_hint
from router.protocol import acp
from router.protocol.errors import AcpRouterError
from router.protocol.jsonrpc import Params, Response, encode_request
from router.protocol.reading import parse
from router.server.control import INITIALIZE_PARAMS

EXIT_CODES = {"active": 0, "inactive": 3}


async def ask_status(url: str, session_id: str, *, time_limit: float) -> int:
    try:
        async with (
            asyncio.timeout(time_limit),
            websockets.connect(url, additional_headers=auth_headers()) as ws,
        ):
            init = await _call(ws, 0, acp.INITIALIZE, INITIALIZE_PARAMS)
            if not acp.has_session_capability(init.result, "status"):
                print(f"{url} does not advertise session/status", file=sys.stderr)
                return 1
            answer = await _call(ws, 1, acp.SESSION_STATUS, {"sessionId": session_id})
    except websockets.InvalidStatus as exc:
        hint = refusal_hint(exc.response.status_code)
        raise AcpRouterError(f"cannot ask {url}: {exc}{hint}") from None
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        raise AcpRouterError(f"cannot ask {url}: {str(exc) or type(exc).__name__}") from None
    if answer.error is not None:
        if answer.error.code == acp.RESOURCE_NOT_FOUND:
            print(f"{session_id}: unknown")
            return 4
        print(f"{session_id}: error {answer.error.code}: {answer.error.message}", file=sys.stderr)
        return 1
    status = answer.result.get("status") if isinstance(answer.result, dict) else None
    print(f"{session_id}: {status}")
    return EXIT_CODES.get(str(status), 3)  # an unrecognised value counts as inactive (RFD)


async def _call(
    ws: websockets.ClientConnection, request_id: int, method: str, params: Params
) -> Response:
    await ws.send(encode_request(request_id, method, params))
    while True:
        message = parse(await ws.recv())
        if isinstance(message, Response) and message.id == request_id:
            return message
