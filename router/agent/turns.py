"""One ``session/prompt`` turn: echo the text, or run a test command.

Every agent message names the instance (``[<id>] ...``) so routing is visible, goes to
the connection that sent the prompt, and is recorded in the store as it is sent. Commands, read from the first text block:

* ``/slow N``: a chunk every ~0.1 s for N seconds; ``session/cancel`` ends it early.
* ``/permission``: ask the client ``session/request_permission`` and report the answer.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from dataclasses import dataclass
from typing import Any

from router.agent.connection import Connection
from router.agent.params import Prompt
from router.agent.sessions import LiveSession, Turn
from router.agent.store import Message, SessionStore, Speaker
from router.protocol import acp, jsonrpc
from router.protocol.errors import InvalidParams, SessionMoved
from router.protocol.jsonrpc import Response

SLOW_INTERVAL = 0.1
MAX_SLOW_SECONDS = 600.0
#: How long a turn waits for the client to answer a permission request.
PERMISSION_TIMEOUT = 300.0
CANCELLED_OUTCOME = "cancelled"


class StopReason(enum.StrEnum):
    END_TURN = "end_turn"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Echo:
    pass


@dataclass(frozen=True, slots=True)
class Slow:
    seconds: float


@dataclass(frozen=True, slots=True)
class AskPermission:
    pass


Command = Echo | Slow | AskPermission


@dataclass(frozen=True, slots=True)
class TurnScope:
    """Everything a turn talks to."""

    agent_id: str
    store: SessionStore
    session: LiveSession
    turn: Turn
    connection: Connection


def parse_command(prompt: Prompt) -> Command:
    """The command a prompt asks for.

    Raises:
        InvalidParams: ``/slow`` without a number of seconds in 0..600.
    """
    words = prompt.command.split()
    if words[:1] == ["/permission"]:
        return AskPermission()
    if words[:1] != ["/slow"]:
        return Echo()
    try:
        seconds = float(words[1])
    except (IndexError, ValueError):
        seconds = -1.0
    if not 0 <= seconds <= MAX_SLOW_SECONDS:
        raise InvalidParams(f"/slow takes a number of seconds from 0 to {MAX_SLOW_SECONDS:g}")
    return Slow(seconds)


async def run_turn(scope: TurnScope, prompt: Prompt, command: Command) -> StopReason:
    """Record the prompt, answer it, and say why the turn stopped.

    Raises:
        SessionMoved: another instance took the session; ``turn_started`` once the
            prompt was recorded (before that, nothing of the turn ran).
    """
    _record_prompt(scope, prompt)
    try:
        if isinstance(command, Slow):
            return await _slow(scope, command.seconds)
        if isinstance(command, AskPermission):
            return await _ask_permission(scope)
        for text in prompt.texts:
            await _say(scope, text)
        return StopReason.END_TURN
    except SessionMoved:
        raise SessionMoved(scope.session.session_id, turn_started=True) from None


def _record_prompt(scope: TurnScope, prompt: Prompt) -> None:
    session = scope.session
    if session.needs_title and prompt.texts:
        first_line = prompt.texts[0].strip().partition("\n")[0]
        scope.store.set_title(session.lease, first_line or "untitled")
        session.needs_title = False
    for text in prompt.texts:
        scope.store.append_message(session.lease, Message(Speaker.USER, text))


async def _say(scope: TurnScope, text: str) -> None:
    """Send (and record) one agent message chunk naming this instance."""
    text = f"[{scope.agent_id}] {text}"
    scope.store.append_message(scope.session.lease, Message(Speaker.AGENT, text))
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    await scope.connection.notify(
        acp.SESSION_UPDATE, {"sessionId": scope.session.session_id, "update": update}
    )


async def _slow(scope: TurnScope, seconds: float) -> StopReason:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    tick = 0
    while not scope.turn.is_cancelled:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return StopReason.END_TURN
        tick += 1
        await _say(scope, f"slow {tick}")
        await scope.turn.pause(min(SLOW_INTERVAL, remaining))
    return StopReason.CANCELLED


async def _ask_permission(scope: TurnScope) -> StopReason:
    connection = scope.connection
    with connection.expect_reply() as (request_id, reply):
        request = jsonrpc.encode_request(
            request_id, acp.REQUEST_PERMISSION, _permission_params(scope.session.session_id)
        )
        await connection.send(request)
        response = await scope.turn.wait_reply(reply, PERMISSION_TIMEOUT)
    await _say(scope, f"permission: {_chosen_option(response)}")
    return StopReason.CANCELLED if scope.turn.is_cancelled else StopReason.END_TURN


def _permission_params(session_id: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "toolCall": {
            "toolCallId": f"call_{uuid.uuid4().hex}",
            "title": "Reference agent asks for permission",
            "status": "pending",
        },
        "options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ],
    }


def _chosen_option(response: Response | None) -> str:
    """The selected ``optionId``; an error, a cancel or anything malformed is cancelled."""
    result = response.result if response is not None and response.ok else None
    outcome = result.get("outcome") if isinstance(result, dict) else None
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return CANCELLED_OUTCOME
    option_id = outcome.get("optionId")
    return option_id if isinstance(option_id, str) else CANCELLED_OUTCOME
