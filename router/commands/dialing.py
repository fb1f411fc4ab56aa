"""Reaching the router for ``acp-router connect`` (:mod:`router.commands.connect`): a
WebSocket connection, tried with jittered exponential backoff for up to
``--reconnect-for`` seconds, and the editor's state replayed on it
(:class:`~router.commands.reattach.Reattach`) before it carries the editor's frames.
"""

from __future__ import annotations

import asyncio
import logging
import random

import websockets
from websockets.asyncio.client import ClientConnection

from router.commands.bearer import auth_headers, refusal_hint
from router.commands.reattach import EditorState, Reattach, ReplayRefused
from router.commands.stdio import EditorPipes
from router.protocol.errors import AcpRouterError, ProtocolError
from router.protocol.jsonrpc import Message, Response
from router.protocol.reading import parse
from router.tasks import cancel_all_and_wait

logger = logging.getLogger(__name__)

#: the reconnect backoff: the first pause, and the longest (each is jittered down by up
#: to half, so bridges that lost the same router do not come back in step)
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
#: a connection that lasted this long starts the backoff over; one that did not (a
#: router that closes every connection at once) keeps it growing
STABLE_SECONDS = 10.0
#: one connection attempt (TCP, TLS, upgrade)
OPEN_SECONDS = 10.0
#: the replay of the editor's handshake and sessions on a new connection
REPLAY_SECONDS = 30.0
#: the closing handshake, when the bridge closes
CLOSE_SECONDS = 2.0


class RouterUnreachable(AcpRouterError):
    """One attempt to reach the router failed; another may not."""


class RouterRefused(AcpRouterError):
    """The router will not take the bridge (its token, its handshake): retrying will not
    help."""


async def open_router(url: str, timeout: float) -> ClientConnection:
    """Raises RouterRefused (401, 403, a URL that is not ws:// or wss://) or
    RouterUnreachable (anything else)."""
    try:
        return await websockets.connect(
            url,
            max_size=None,
            compression=None,
            additional_headers=auth_headers(),
            open_timeout=timeout,
            close_timeout=CLOSE_SECONDS,
        )
    except websockets.InvalidStatus as exc:
        status = exc.response.status_code
        refused = RouterRefused if status in (401, 403) else RouterUnreachable
        raise refused(f"{exc}{refusal_hint(status)}") from None
    except websockets.InvalidURI as exc:
        raise RouterRefused(str(exc)) from None
    except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
        raise RouterUnreachable(str(exc) or type(exc).__name__) from None


class Dialer:
    """Reaches the router for the bridge, first and after each loss, and replays the
    editor's state there; the backoff grows with every failed attempt."""

    def __init__(
        self, url: str, reconnect_for: float, pipes: EditorPipes, editor: EditorState
    ) -> None:
        self._url = url
        self._reconnect_for = reconnect_for
        self._pipes = pipes
        self._editor = editor
        self._delay = BACKOFF_FIRST_SECONDS

    def lasted(self, seconds: float) -> None:
        """A connection lasted ``seconds``: :data:`STABLE_SECONDS` or more starts the
        backoff over."""
        if seconds >= STABLE_SECONDS:
            self._delay = BACKOFF_FIRST_SECONDS

    async def reach(self, *, first: bool) -> ClientConnection | None:
        """Reach the router and replay the editor's state there: the connection, or None
        when stdin ended first (on a reconnect: the editor is gone). The first connection is tried at
        once, its first failure said on stderr, and the end of stdin does not stop it
        (a script's lines are sent once it is up); a reconnect waits a backoff pause
        first.

        Raises:
            RouterRefused: refused, or not reached within ``--reconnect-for``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_for
        last = ""
        holding = asyncio.create_task(self._pipes.hold(), name="stdin-held")
        attempt: asyncio.Task[ClientConnection] | None = None
        try:
            pause = 0.0 if first else self._next_pause()
            while (remaining := deadline - loop.time()) > 0:
                if not await self._pause(min(pause, remaining), holding, first=first):
                    return None
                attempt = asyncio.create_task(
                    self._attempt(max(deadline - loop.time(), 0.1)), name="reconnect"
                )
                stoppers = {attempt} if first else {attempt, holding}
                await asyncio.wait(stoppers, return_when=asyncio.FIRST_COMPLETED)
                if not attempt.done():
                    return None  # stdin ended first: the attempt is stopped below
                try:
                    ws = attempt.result()
                except RouterRefused as exc:
                    if first:
                        raise RouterRefused(f"cannot connect to {self._url}: {exc}") from None
                    raise
                except RouterUnreachable as exc:
                    if first and not last:
                        logger.info(
                            "cannot reach %s yet (%s): retrying for up to %g s",
                            self._url,
                            exc,
                            self._reconnect_for,
                        )
                    last = str(exc)
                    pause = self._next_pause()
                    continue
                if not first:
                    logger.info("reconnected to %s", self._url)
                return ws
        finally:  # cancelled while waiting, too: nothing of this attempt runs on
            running = [attempt] if attempt is not None and not attempt.done() else []
            await cancel_all_and_wait(holding, *running)
        verb = "connect" if first else "reconnect"
        raise RouterRefused(
            f"cannot {verb} to {self._url} within {self._reconnect_for:g} s: {last}"
        )

    async def _pause(self, seconds: float, holding: asyncio.Task[None], *, first: bool) -> bool:
        """Wait ``seconds``; False when stdin ended meanwhile, on a reconnect."""
        if first:
            await asyncio.sleep(seconds)  # the backoff itself
            return True
        await asyncio.wait({holding}, timeout=seconds)
        return not holding.done()

    def _next_pause(self) -> float:
        """The next backoff pause (jittered down by up to half); the backoff grows."""
        pause = random.uniform(self._delay / 2, self._delay)
        self._delay = min(self._delay * 2, BACKOFF_MAX_SECONDS)
        return pause

    async def _attempt(self, remaining: float) -> ClientConnection:
        """Connect and replay; the connection, ready for the editor's frames.

        Raises:
            RouterUnreachable: try again later.
            RouterRefused: the router refused the bridge's token or its replay.
        """
        ws = await open_router(self._url, min(OPEN_SECONDS, remaining))
        try:
            async with asyncio.timeout(REPLAY_SECONDS):
                await self._replay(ws)
        except (TimeoutError, websockets.ConnectionClosed) as exc:
            ws.transport.abort()
            failure = str(exc) or type(exc).__name__
            raise RouterUnreachable(f"the replay failed: {failure}") from None
        except ReplayRefused as exc:
            ws.transport.abort()
            raise RouterRefused(str(exc)) from None
        except BaseException:
            ws.transport.abort()
            raise
        return ws

    async def _replay(self, ws: ClientConnection) -> None:
        reattach = Reattach(self._editor)
        for step in reattach.start():
            await ws.send(step)
        while not reattach.done:
            frame = await ws.recv()
            if not isinstance(frame, str):
                continue
            try:
                message: Message | None = parse(frame)
            except ProtocolError:
                message = None
            if isinstance(message, Response) and reattach.owns(message):
                for step in reattach.answered(message):
                    await ws.send(step)
            elif message is None or not reattach.mutes(message):
                if message is not None:
                    self._editor.received(message)
                await self._pipes.write(frame)
        for session_id, refusal in reattach.dropped:
            logger.warning("session %s is not attached again: %s", session_id, refusal)
