"""A stdio ACP agent built on the official Python SDK (``agent-client-protocol``), in the
shape of the SDK's own ``examples/echo_agent.py``.

It keeps sessions in memory, and every reply names its process (``[pid 123] hello``),
so a test can tell which agent process answered (``--no-resume``: an agent without
session/resume and session/close, only loadSession). A prompt starting with
``/permission`` asks the client ``session/request_permission`` first; a text block
``/flood N`` is answered with N characters, and once the turn's replies are written the
agent says ``flooded`` on stderr. Run:
``python -m tests.agents.sdk_echo_agent``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any
from uuid import uuid4

import acp
from acp.schema import (
    AgentCapabilities,
    CloseSessionResponse,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionResumeCapabilities,
    ToolCallUpdate,
)

TAG = f"[pid {os.getpid()}]"


class EchoAgent:
    """``sessions`` (session id -> the replies so far) may be shared by the agents of
    one process, so a session made on one connection loads on another; ``resume``:
    offer session/resume and session/close (the SDK routes them only when its
    unstable flag is on)."""

    def __init__(
        self, sessions: dict[str, list[str]] | None = None, *, resume: bool = True
    ) -> None:
        self._conn: Any = None
        self._sessions: dict[str, list[str]] = {} if sessions is None else sessions
        self._resume = resume

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_info=Implementation(name="sdk-echo-agent", version="0.0.1"),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                session_capabilities=SessionCapabilities(
                    resume=SessionResumeCapabilities(), close=SessionCloseCapabilities()
                )
                if self._resume
                else SessionCapabilities(),
            ),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess_{uuid4().hex}"
        self._sessions[session_id] = []
        return NewSessionResponse(session_id=session_id)

    def _known(self, session_id: str) -> list[str]:
        history = self._sessions.get(session_id)
        if history is None:
            raise acp.RequestError.resource_not_found(session_id)
        return history

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        for text in self._known(session_id):
            await self._say(session_id, text)
        return LoadSessionResponse()

    async def resume_session(
        self, cwd: str, session_id: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        self._known(session_id)
        return ResumeSessionResponse()

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        self._known(session_id)
        del self._sessions[session_id]
        return CloseSessionResponse()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        history = self._known(session_id)
        flooded = False
        for block in prompt:
            text = getattr(block, "text", "")
            if text.startswith("/permission"):
                text = f"permission: {await self._ask(session_id)}"
            if text.startswith("/flood "):
                text, flooded = "x" * int(text.split()[1]), True
            reply = f"{TAG} {text}"
            history.append(reply)
            await self._say(session_id, reply)
        if flooded:
            sys.stderr.write(f"{TAG} flooded\n")
            sys.stderr.flush()
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None

    async def _ask(self, session_id: str) -> str:
        options = [
            PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
            PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
        ]
        tool_call = ToolCallUpdate(tool_call_id="call_1", title="touch a file")
        answer = await self._conn.request_permission(
            session_id=session_id, tool_call=tool_call, options=options
        )
        outcome = answer.outcome
        return str(getattr(outcome, "option_id", None) or outcome.outcome)

    async def _say(self, session_id: str, text: str) -> None:
        await self._conn.session_update(
            session_id=session_id, update=acp.update_agent_message(acp.text_block(text))
        )


def main() -> None:
    # resume and close are routed by SDK 0.12.1 only with the unstable flag on; with
    # --no-resume the agent offers neither (and the SDK answers them -32601)
    resume = "--no-resume" not in sys.argv[1:]
    agent = EchoAgent(resume=resume)
    asyncio.run(acp.run_agent(agent, use_unstable_protocol=resume))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
