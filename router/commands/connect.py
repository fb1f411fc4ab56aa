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
* reconnects with jittered exponential backoff, for up to ``--reconnect-for`` seconds;
* replays the editor's ``initialize``, its last accepted ``authenticate`` and every
  session it had attached (:mod:`router.commands.reattach`), keeping the answers (and
  the history a replayed ``session/load`` sends again) from the editor;
* then sends what the editor wrote meanwhile, in order (up to :data:`MAX_HELD` lines;
  then stdin waits). An answer to an agent request made on the old connection is
  dropped: its id meant something there only.

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
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import random
import select
import stat
import sys
import threading
from collections.abc import Iterable, Iterator

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from router.commands.bearer import auth_headers, refusal_hint
from router.commands.reattach import (
    EditorState,
    Reattach,
    Reattachments,
    ReplayRefused,
    Steps,
)
from router.protocol.errors import AcpRouterError, ProtocolError
from router.protocol.jsonrpc import Message, Response
from router.protocol.reading import parse
from router.tasks import cancel_all_and_wait, cancel_and_wait

logger = logging.getLogger(__name__)

#: after stdin ends, how long answers still owed may take before the bridge closes
DRAIN_SECONDS = 60.0
#: how long the bridge tries to reach the router again before it gives up (the default
#: of ``--reconnect-for``)
RECONNECT_FOR_SECONDS = 60.0
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
#: editor lines held while there is no connection
MAX_HELD = 1024
#: close codes after which the bridge reconnects: going away, abnormal closure (no
#: close frame: the connection was lost), internal error, service restart, try again
#: later, bad gateway
RECONNECT_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})


class RouterUnreachable(AcpRouterError):
    """One attempt to reach the router failed; another may not."""


class RouterRefused(AcpRouterError):
    """The router will not take the bridge (its token, its handshake): retrying will not
    help."""


class EditorGone(AcpRouterError):
    """The editor closed the bridge's stdout."""


async def run_bridge(url: str, *, reconnect_for: float = RECONNECT_FOR_SECONDS) -> int:
    """Bridge stdio to ``url`` until the editor is done; the exit status.

    Raises:
        AcpRouterError: the router was never reached (the bridge never started).
    """
    bridge = Bridge(url, StdinLines(), await _stdout(), reconnect_for=reconnect_for)
    try:
        return await bridge.run()
    except EditorGone:
        # nothing reads stdout (fd 1): the interpreter's last flush goes nowhere, not fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 0
    except RouterRefused as exc:
        logger.error("%s", exc)
        return 1


async def _open(url: str, timeout: float) -> ClientConnection:
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


class StdinLines:
    """Lines of stdin, read by a daemon thread with ``os.read`` on fd 0: works for pipes,
    files, terminals and /dev/null alike (epoll takes only some of them), and never
    holds up the exit (it takes no lock the interpreter wants at shutdown, as
    ``sys.stdin.buffer`` would). The small queue makes the thread wait when the router
    is slower than the editor."""

    def __init__(self) -> None:
        self._lines: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="stdin", daemon=True).start()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for line in _lines_of(sys.stdin.fileno()):
                self._put(line, loop)
            self._put(b"", loop)
        except (RuntimeError, concurrent.futures.CancelledError):
            pass  # the loop is gone: the bridge is exiting

    def _put(self, line: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``line`` on the loop's side, waiting while the queue is full."""
        put = self._lines.put(line)
        try:
            asyncio.run_coroutine_threadsafe(put, loop).result()
        except RuntimeError:  # the loop closed first: the coroutine never ran
            put.close()
            raise

    async def readline(self) -> bytes:
        """The next line, or b"" at the end of stdin."""
        return await self._lines.get()


def _lines_of(fd: int) -> Iterator[bytes]:
    """The lines read from ``fd`` (the last one perhaps without its newline), until its
    end or an error."""
    pending = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:  # a descriptor someone made non-blocking
            select.select([fd], [], [])
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        searched = len(pending)
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", max(start, searched))) >= 0:
            yield bytes(pending[start : end + 1])
            start = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


async def _stdout() -> asyncio.StreamWriter | None:
    """A non-blocking writer when stdout is a pipe or a socket (editors spawn agents with
    either; a slow editor then holds the bridge back without blocking it); None for a
    file or a terminal, which take plain writes."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(sys.stdout.fileno()).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


class Bridge:
    """Pumps lines one way and frames the other over the current connection, and puts
    the editor's state back on a new one when the router goes away."""

    def __init__(
        self,
        url: str,
        stdin: StdinLines,
        stdout: asyncio.StreamWriter | None,
        *,
        reconnect_for: float,
    ) -> None:
        self._url = url
        self._ws: ClientConnection | None = None
        self._stdin = stdin
        self._stdout = stdout
        self._reconnect_for = reconnect_for
        self._editor = EditorState()
        self._again = Reattachments(self._editor)
        #: editor lines read while there was no connection, to send once there is
        self._held: collections.deque[bytes] = collections.deque()
        self._stdin_ended = False
        self._settled = asyncio.Event()  # nothing owed
        self._settled.set()
        self._delay = BACKOFF_FIRST_SECONDS

    async def run(self) -> int:
        """Bridge until the editor is done or the router is gone for good.

        Raises:
            AcpRouterError: the router was never reached.
            RouterRefused: the router refused the bridge on a reconnect, or was not
                reached again within ``--reconnect-for``.
            EditorGone: stdout was closed.
        """
        try:
            reached = await self._reach(first=True)
        except RouterRefused as exc:
            raise AcpRouterError(str(exc)) from None
        if not reached:  # stdin ended first
            why = "the bridge stopped waiting: its stdin ended"
            await self._answer(self._editor.lost(why, _parsed(self._held)))
            return 0
        loop = asyncio.get_running_loop()
        while True:
            opened = loop.time()
            ws = await self._serve()
            if loop.time() - opened >= STABLE_SECONDS:
                self._delay = BACKOFF_FIRST_SECONDS
            code, reason = ws.close_code, ws.close_reason
            why = (
                "the bridge stopped waiting: its stdin ended"
                if code is None
                else f"the router connection was lost ({code} {reason})".rstrip()
            )
            await self._answer(self._editor.lost(why))
            self._again = Reattachments(self._editor)
            if self._stdin_ended:
                await ws.close()
                return 0
            if code not in RECONNECT_CODES:
                if code == 1000:
                    return 0
                logger.error("connection lost: %s %s", code, reason)
                return 1
            if not await self._reach(first=False):  # stdin ended first
                await self._answer(self._editor.lost(why, _parsed(self._held)))
                return 0

    # -- one connection ------------------------------------------------------------------------

    async def _serve(self) -> ClientConnection:
        """Pump both ways until the connection closes, or stdin ends and the answers
        still owed are through (or :data:`DRAIN_SECONDS` have passed); the connection."""
        ws = self._ws
        assert ws is not None
        upstream = asyncio.create_task(self._upstream(ws), name="stdin-to-ws")
        downstream = asyncio.create_task(self._downstream(ws), name="ws-to-stdout")
        try:
            done, _ = await asyncio.wait(
                {upstream, downstream}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # the editor gone
            if downstream.done():
                return ws
            if self._stdin_ended:
                await self._let_answers_through(downstream)
            else:  # a send failed: the connection is closing
                await downstream
            return ws
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
            if self._held:
                line = self._held.popleft()
            else:  # stdin may have ended while the first connection was being made
                line = b"" if self._stdin_ended else await self._stdin.readline()
            if not line:
                self._stdin_ended = True
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
                    await self._write_frame(frame)
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

    # -- reconnecting --------------------------------------------------------------------------

    async def _reach(self, *, first: bool) -> bool:
        """Reach the router and replay the editor's state there; False when stdin ended
        first (on a reconnect: the editor is gone). The first connection is tried at
        once, its first failure said on stderr, and the end of stdin does not stop it
        (a script's lines are sent once it is up); a reconnect waits a backoff pause
        first.

        Raises:
            RouterRefused: refused, or not reached within ``--reconnect-for``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_for
        last = ""
        holding = asyncio.create_task(self._hold_stdin(), name="stdin-held")
        attempt: asyncio.Task[ClientConnection] | None = None
        try:
            pause = 0.0 if first else self._next_pause()
            while (remaining := deadline - loop.time()) > 0:
                if not await self._pause(min(pause, remaining), holding, first=first):
                    return False
                attempt = asyncio.create_task(
                    self._attempt(max(deadline - loop.time(), 0.1)), name="reconnect"
                )
                stoppers = {attempt} if first else {attempt, holding}
                await asyncio.wait(stoppers, return_when=asyncio.FIRST_COMPLETED)
                if not attempt.done():
                    return False  # stdin ended first: the attempt is stopped below
                try:
                    self._ws = attempt.result()
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
                return True
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

    async def _hold_stdin(self) -> None:
        """Read the editor's lines while there is no connection, to send them once there
        is one; returns when stdin ends."""
        while True:
            if len(self._held) >= MAX_HELD:  # stdin waits until the replay is done
                await asyncio.get_running_loop().create_future()
            line = await self._stdin.readline()
            if not line:
                self._stdin_ended = True
                return
            self._held.append(line)

    async def _attempt(self, remaining: float) -> ClientConnection:
        """Connect and replay; the connection, ready for the editor's frames.

        Raises:
            RouterUnreachable: try again later.
            RouterRefused: the router refused the bridge's token or its replay.
        """
        ws = await _open(self._url, min(OPEN_SECONDS, remaining))
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
                await self._write_frame(frame)
        for session_id, refusal in reattach.dropped:
            logger.warning("session %s is not attached again: %s", session_id, refusal)

    # -- the editor's side ---------------------------------------------------------------------

    async def _answer(self, frames: list[str]) -> None:
        for frame in frames:
            await self._write_frame(frame)
        self._note_settled()

    async def _write_frame(self, frame: str) -> None:
        line = _one_line(frame).encode() + b"\n"
        try:
            if self._stdout is None:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            else:
                self._stdout.write(line)
                await self._stdout.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise EditorGone() from None


def _parsed(lines: Iterable[bytes]) -> list[Message]:
    messages = []
    for line in lines:
        try:
            messages.append(parse(line))
        except ProtocolError:
            continue
    return messages


def _one_line(frame: str) -> str:
    if "\n" not in frame and "\r" not in frame:
        return frame
    try:
        return orjson.dumps(orjson.loads(frame)).decode()
    except orjson.JSONDecodeError:
        return frame.replace("\r", " ").replace("\n", " ")
