"""A minimal ACP v2 stdio agent (no SDK speaks v2 on this machine's Python): it answers
``initialize`` in the v2 layout, reports foreground state with ``state_update``, and
sends a ``state_update`` snapshot before answering ``session/resume``, as v2 asks.

A prompt answers ``{}`` at once (v2), then reports ``running`` and ``idle``; a prompt
``/malformed`` reports a state that is not a StateUpdate. Run: ``python -m
tests.agents.v2_agent``.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from uuid import uuid4

STATES: dict[str, dict[str, Any]] = {}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def state(session_id: str, update: dict[str, Any]) -> None:
    STATES[session_id] = update
    params = {"sessionId": session_id, "update": {"sessionUpdate": "state_update", **update}}
    send({"method": "session/update", "params": params})


def answer(request_id: Any, method: str, params: dict[str, Any]) -> None:
    session_id = params.get("sessionId", "")
    if method == "initialize":
        result = {
            "protocolVersion": 2,
            "info": {"name": "v2-agent", "version": "0.0.1"},
            "capabilities": {"session": {}},
        }
        send({"id": request_id, "result": result})
    elif method == "session/new":
        new_id = f"sess_{uuid4().hex}"
        STATES[new_id] = {"state": "idle"}
        send({"id": request_id, "result": {"sessionId": new_id}})
    elif session_id not in STATES:
        error = {"code": -32002, "message": "Resource not found", "data": {"sessionId": session_id}}
        send({"id": request_id, "error": error})
    elif method == "session/resume":
        state(session_id, STATES[session_id])  # the snapshot comes before the answer
        send({"id": request_id, "result": {}})
    elif method == "session/prompt":
        send({"id": request_id, "result": {}})
        state(session_id, {"state": "running"})
        text = params["prompt"][0].get("text", "")
        if text == "/malformed":
            state(session_id, {"state": 5})
        else:
            state(session_id, {"state": "idle", "stopReason": "end_turn"})
    else:
        send({"id": request_id, "result": {}})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" in message and "method" in message:
            answer(message["id"], message["method"], message.get("params") or {})


if __name__ == "__main__":
    main()
