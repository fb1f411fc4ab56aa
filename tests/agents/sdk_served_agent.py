"""The SDK echo agent (:mod:`tests.agents.sdk_echo_agent`) served by the SDK's own ASGI
app (``acp.http.asgi.create_asgi_app``) under uvicorn: the RFD's remote transport, both
profiles (Streamable HTTP and WebSocket) at ``/acp``.

The app makes one agent per connection; they share the process's session store, so a
session made on one connection loads on the next. SDK 0.12.1's server routes
session/resume and session/close only behind its unstable flag, which its ASGI app
does not set: the agent offers session/load only. It prints ``sdk agent listening on
ws://127.0.0.1:PORT/acp`` once its socket listens, then serves until SIGTERM. Run:
``python -m tests.agents.sdk_served_agent``.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from acp.http.asgi import create_asgi_app

from tests.agents.sdk_echo_agent import EchoAgent


def main() -> None:
    sessions: dict[str, list[str]] = {}

    def agent_for(connection: Any) -> EchoAgent:
        return EchoAgent(sessions, resume=False)

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    # the SDK types the factory's result as its Agent protocol, which EchoAgent meets
    # only in the methods it uses (the SDK answers -32601 for the rest)
    app = create_asgi_app(agent_for)  # type: ignore[arg-type]
    config = uvicorn.Config(app, lifespan="off", ws="websockets-sansio", log_level="warning")
    print(f"sdk agent listening on ws://127.0.0.1:{port}/acp", flush=True)  # noqa: T201
    asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))


if __name__ == "__main__":
    main()
