"""``acp-router connect URL``: a stdio <-> WebSocket bridge that rides through router
restarts.

Editors launch ACP agents as subprocesses and speak newline-delimited JSON-RPC on
their stdin/stdout (ACP's stdio transport). Launching ``acp-router connect
ws://router:8765/acp`` as the "agent" puts the whole fleet behind that editor: every
line read on stdin goes out as one text frame, every text frame received is written
as one line. Frames are passed as they are, except that a frame holding a raw
newline (legal JSON whitespace, illegal in NDJSON) is re-encoded on one line.

An editor started while the router is not up yet (a restart, a fleet still starting)
does not fail either: the bridge tries to reach the router with the same backoff as
below for up to ``--reconnect-for`` seconds (saying so once on stderr), holding what
the editor writes meanwhile.

When the router goes away (a restart closes with 1012; 1001, 1011, 1013 and 1014 too,
or the connection is simply lost), the editor does not see its agent die. The bridge

* answers each request that was awaiting an answer, once, with a retryable ``-32013``
  (``data.reason`` says the router connection was lost);
* reconnects with jittered exponential backoff, for up to ``--reconnect-for`` seconds
  (:mod:`router.commands.dialing`);
* replays the editor's ``initialize``, its last accepted ``authenticate`` and every
  session it had attached (:mod:`router.commands.reattach`), keeping the answers (and
  the history a replayed ``session/load`` sends again) from the editor;
* then sends what the editor wrote meanwhile, in order (up to
  :data:`~router.commands.stdio.MAX_HELD` lines; then stdin waits). An answer to an
  agent request made on the old connection is dropped: its id meant something there
  only.

When the router lets go of an attached session while the connection stays up (the
agent that held it was restarted, say), the request that finds it so (``-32010``, "send
session/resume first") is kept from the editor: the bridge attaches the session again
and sends the request once more (:class:`~router.commands.reattach.Reattachments`).

Exit status: 0 when stdin ends (answers still owed get :data:`DRAIN_SECONDS`; a close
meanwhile ends the bridge, no reconnect) or the router closes normally (1000); 1, with
one line on stderr, when the router closes for another reason, refuses the bridge's
token (401, 403) or the replayed handshake, or cannot be reached again within
``--reconnect-for``; 2, with one line, when it was never reached: refused at once, or
not reached within ``--reconnect-for``.

docs/transport.md ("The stdio bridge: ``connect``") says how to use it; the editor's
stdin and stdout are :mod:`router.commands.stdio`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable

import websockets
from websockets.asyncio.client import ClientConnection

from router.commands.dialing import Dialer, RouterRefused
from router.commands.reattach import EditorState, Reattachments, Steps
from router.commands.stdio import EditorGone, EditorPipes, StdinLines, open_stdout
from router.protocol.errors import AcpRouterError, ProtocolError
from router.protocol.jsonrpc import Message
from router.protocol.reading import parse
from router.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

#: after stdin ends, how long answers still owed may take before the bridge closes
DRAIN_SECONDS = 60.0
#: how long the bridge tries to reach the router again before it gives up (the default
#: of ``--reconnect-for``)
RECONNECT_FOR_SECONDS = 60.0
#: close codes after which the bridge reconnects: going away, abnormal closure (no
#: close frame: the connection was lost), internal error, service restart, try again
#: later, bad gateway
RECONNECT_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})


async def run_bridge(url: str, *, reconnect_for: float = RECONNECT_FOR_SECONDS) -> int:
    """Bridge stdio to ``url`` until the editor is done; the exit status.

    Raises:
        AcpRouterError: the router was never reached (the bridge never started).
    """
    pipes = EditorPipes(StdinLines(), await open_stdout())
    bridge = Bridge(url, pipes, reconnect_for=reconnect_for)
    try:
        return await bridge.run()
    except EditorGone:
        # nothing reads stdout (fd 1): the interpreter's last flush goes nowhere, not fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 0
    except RouterRefused as exc:
        logger.error("%s", exc)
        return 1


class Bridge:
    """Pumps lines one way and frames the other over the current connection, and puts
    the editor's state back on a new one when the router goes away."""

    def __init__(self, url: str, pipes: EditorPipes, *, reconnect_for: float) -> None:
        self._pipes = pipes
        self._editor = EditorState()
        self._again = Reattachments(self._editor)
        self._dialer = Dialer(url, reconnect_for, pipes, self._editor)
        self._settled = asyncio.Event()  # nothing owed
        self._settled.set()

    async def run(self) -> int:
        """Bridge until the editor is done or the router is gone for good.

        Raises:
            AcpRouterError: the router was never reached.
            RouterRefused: the router refused the bridge on a reconnect, or was not
                reached again within ``--reconnect-for``.
            EditorGone: stdout was closed.
        """
        try:
            ws = await self._dialer.reach(first=True)
        except RouterRefused as exc:
            raise AcpRouterError(str(exc)) from None
        if ws is None:  # stdin ended first
            why = "the bridge stopped waiting: its stdin ended"
            await self._answer(self._editor.lost(why, _parsed(self._pipes.held)))
            return 0
        loop = asyncio.get_running_loop()
        while True:
            opened = loop.time()
            await self._serve(ws)
            self._dialer.lasted(loop.time() - opened)
            code, reason = ws.close_code, ws.close_reason
            why = (
                "the bridge stopped waiting: its stdin ended"
                if code is None
                else f"the router connection was lost ({code} {reason})".rstrip()
            )
            await self._answer(self._editor.lost(why))
            self._again = Reattachments(self._editor)
            if self._pipes.ended:
                await ws.close()
                return 0
            if code not in RECONNECT_CODES:
                if code == 1000:
                    return 0
                logger.error("connection lost: %s %s", code, reason)
                return 1
            ws = await self._dialer.reach(first=False)
            if ws is None:  # stdin ended first
                await self._answer(self._editor.lost(why, _parsed(self._pipes.held)))
                return 0

    # -- one connection ------------------------------------------------------------------------

    async def _serve(self, ws: ClientConnection) -> None:
        """Pump both ways until the connection closes, or stdin ends and the answers
        still owed are through (or :data:`DRAIN_SECONDS` have passed)."""
        upstream = asyncio.create_task(self._upstream(ws), name="stdin-to-ws")
        downstream = asyncio.create_task(self._downstream(ws), name="ws-to-stdout")
        try:
            done, _ = await asyncio.wait(
                {upstream, downstream}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # the editor gone
            if downstream.done():
                return
            if self._pipes.ended:
                await self._let_answers_through(downstream)
            else:  # a send failed: the connection is closing
                await downstream
        finally:  # a send that failed as the connection closed ended its task: not news
            for task in (upstream, downstream):
                task.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)

    async def _let_answers_through(self, downstream: asyncio.Task[None]) -> None:
        settled = asyncio.create_task(self._settled.wait())
        try:
            await asyncio.wait(
                {settled, downstream}, timeout=DRAIN_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await cancel_and_wait(settled)

    async def _upstream(self, ws: ClientConnection) -> None:
        """Editor lines to the router, those held while reconnecting first; returns when
        stdin ends or a send fails (the connection is going)."""
        while True:
            line = await self._pipes.next_line()
            if not line:
                return
            text = line.decode(errors="replace").strip()
            if not text or not self._sending(text):
                continue
            try:
                await ws.send(text)
            except websockets.ConnectionClosed:
                return

    async def _downstream(self, ws: ClientConnection) -> None:
        """Router frames to the editor, except those :class:`Reattachments` takes (and
        the frames those send to the router)."""
        try:
            async for frame in ws:
                if not isinstance(frame, str):  # binary frames are not ACP
                    continue
                steps = self._received(frame)
                if steps is None:
                    await self._pipes.write(frame)
                    continue
                for text in steps.to_router:
                    await ws.send(text)
                await self._answer(steps.to_editor)
        except websockets.ConnectionClosed:  # what it owes the editor is answered after
            pass

    def _sending(self, text: str) -> bool:
        try:
            message = parse(text)
        except ProtocolError:
            return True  # the router answers it (-32700, -32600)
        keep = self._editor.sending(message)
        self._note_settled()
        return keep

    def _received(self, text: str) -> Steps | None:
        """Note a frame from the router; None: pass it on, else what to do instead."""
        try:
            message = parse(text)
        except ProtocolError:
            return None
        steps = self._again.take(message)
        if steps is None:
            self._editor.received(message)
            self._note_settled()
        return steps

    def _note_settled(self) -> None:
        if self._editor.owes:
            self._settled.clear()
        else:
            self._settled.set()

    # -- the editor's side ---------------------------------------------------------------------

    async def _answer(self, frames: list[str]) -> None:
        for frame in frames:
            await self._pipes.write(frame)
        self._note_settled()


def _parsed(lines: Iterable[bytes]) -> list[Message]:
    messages = []
    for line in lines:
        try:
            messages.append(parse(line))
        except ProtocolError:
            continue
    return messages
