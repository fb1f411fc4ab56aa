"""One client connection's links to backends, and the channel its frames leave by
(docs/architecture.md, "Links").

A link is opened when the core says so (:class:`router.core.effects.OpenLink`), with the
frames it must send first already in its outbox; from then on it lives on its socket's
callbacks, not in a task. Frames queued on it never make the loop wait (each link has
its own outbox and writer). A link that breaks, cannot open within the deadline or cannot
keep up is given up once: the core answers its calls and withdraws its agent requests
(:meth:`router.core.routes.ClientRoutes.backend_lost`); the client connection carries on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from router.core.effects import CancelTurn, CloseLink, Effects, OpenLink
from router.core.gate import Gate
from router.core.routes import ClientRoutes
from router.protocol import utf8
from router.protocol.errors import BackendLinkLost, ErrorObject, HandshakeRefused
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, RequestId
from router.server.links.backend_link import BackendLink
from router.server.observability import log_context
from router.server.observability.metrics import TO_BACKEND, TO_CLIENT
from router.server.pool.backends import Pool

logger = logging.getLogger(__name__)


class ClientChannel(Protocol):
    """Where one client connection's frames leave, whatever carries them (a WebSocket,
    or Streamable HTTP's event streams), and how it is closed."""

    #: whether :meth:`send` may run outside a task (inline, from a backend link's socket
    #: callback: :mod:`router.server.links.inline`): it uses no ``asyncio.timeout`` then
    inline: bool

    def write(self, text: str) -> bool:
        """Write ``text`` now if that needs no waiting (True); else write nothing (False:
        :meth:`send` it)."""

    async def send(
        self, text: str, message: Message | None = None, answers: RequestId | None = None
    ) -> None:
        """Write one JSON-RPC message to the client, in call order; a client that is
        gone is not an error (its connection ends on its own). ``message`` is what was
        parsed of a backend's frame, ``answers`` the request a reply the router made
        answers: a transport that routes frames by them reads them there, never the
        text again."""

    async def close(self, code: int, reason: str) -> None:
        """End the connection with a WebSocket close ``code`` (or its meaning)."""


#: how the links start work in their connection's tasks
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class ClientLinks:
    """The open links of one client connection, at most one per backend."""

    def __init__(
        self,
        pool: Pool,
        channel: ClientChannel,
        gate: Gate,
        routes: ClientRoutes,
        spawn: Spawn,
        carry_out: Callable[[Effects], Coroutine[Any, Any, None] | None],
    ) -> None:
        self.pool = pool
        self.metrics = pool.metrics
        self.channel = channel
        self.gate = gate
        self.routes = routes
        self._spawn = spawn
        self._carry_out = carry_out
        #: the open links by backend (one table for the connection's life)
        self.open: dict[BackendId, BackendLink] = {}

    async def sent(self) -> None:
        """Wait until every link has written what was queued on it."""
        await asyncio.gather(*(link.sent() for link in self.open.values()))

    async def close_all(self, reason: str) -> None:
        """Close every link, once each has sent what was queued on it (cancels among
        them)."""
        links = dict(self.open)
        self.open.clear()  # in place: each link's router reads this same table
        await asyncio.gather(*(link.sent() for link in links.values()))
        for link in links.values():  # an open link lives on its socket, not in a task
            link.close(reason)

    def send(self, backend: BackendId, text: str) -> Coroutine[Any, Any, None] | None:
        """Queue ``text`` on the link to ``backend`` (the core opened it): never waits on
        the backend. None when it is queued (or dropped: the link was given up since);
        the coroutine that gives the link up when it takes no more."""
        link = self.open.get(backend)
        if link is None:  # given up since the core routed there: its calls are answered
            logger.debug("dropped a frame for backend %s: its link has ended", backend)
            return None
        forwarded = link.forward(text)
        self.metrics.count_frame(TO_BACKEND, text)  # once it is written: the prompt waits on it
        if forwarded:
            return None
        return self._lose(link, link.ended or "closed")

    def cancel_turn(self, turn: CancelTurn) -> None:
        """Queue the core's ``session/cancel`` on the link to its backend: never waits
        (the link sends it before it closes)."""
        link = self.open.get(turn.backend)
        if link is None or not link.offer(turn.text):
            logger.debug("no link to backend %s left to cancel a turn on", turn.backend)
            return
        self.metrics.count_frame(TO_BACKEND, turn.text)
        self.metrics.turns_cancelled.labels(turn.why).inc()
        logger.info(
            "cancelled the turn of session %s on backend %s: %s",
            turn.session_id,
            turn.backend,
            "its client is gone" if turn.why == "client_gone" else "the router is stopping",
            extra={"backend": turn.backend, "session": turn.session_id, "outcome": turn.why},
        )

    def close_unused(self, command: CloseLink) -> None:
        """Close a link the core opened ahead and did not need, quietly (nothing was
        ever routed on it, so nothing is answered or withdrawn)."""
        link = self.open.pop(command.backend, None)
        if link is not None:
            link.close(command.reason)

    def start(self, command: OpenLink) -> BackendLink:
        """Open the link the core asked for, its first frames queued."""
        backend = command.backend
        settings = self.pool.settings.router
        link = BackendLink(
            backend,
            self.pool.url(backend),
            self.metrics,
            max_message_bytes=settings.max_message_bytes,
            connect_timeout=settings.connect_timeout_ms / 1000,
            tls=self.pool.tls(backend),
            inline=self.channel.inline,
        )
        self.open[backend] = link
        for text in command.first:
            self.metrics.count_frame(TO_BACKEND, text)
            link.offer(text)  # an empty outbox takes any frame a client may send
        self.pool.pin(backend, 1)  # until the link has ended (_run or _ended)
        self._spawn(self._run(link, command), f"link-{backend}")
        return link

    async def _run(self, link: BackendLink, command: OpenLink) -> None:
        """Open ``link``: from then on it lives on its socket's callbacks, without a task,
        until :meth:`_ended`. A link that cannot open is given up here."""
        log_context.backend.set(link.backend)
        refused: ErrorObject | None = None
        opened = running = False

        def on_open(result: Any) -> None:
            nonlocal opened
            opened = True
            self.pool.client_link_up(link.backend, result)

        try:
            await link.open(
                command.initialize,
                command.authenticate,
                self._from(link),
                self._ended,
                on_open,
            )
            running = True
            return
        except BackendLinkLost as exc:
            reason = str((exc.data or {}).get("reason", exc.message))
            refused = exc.refusal if isinstance(exc, HandshakeRefused) else None
        except Exception:  # the link task's boundary: its calls must still be answered
            logger.exception("link to backend %s failed", link.backend)
            link.close("router error")
            reason = "router error"
        finally:  # it did not open (cancelled too): the link has ended here
            if not running:
                if opened:
                    self.pool.client_link_down(link.backend)
                self.pool.pin(link.backend, -1)
                if link.timed_out:
                    self.pool.unanswered(link.backend, "a client link's handshake")
        await self._lose(link, reason, refused)

    def _ended(self, link: BackendLink, reason: str) -> None:
        """An open link's socket is gone (closed by either side, or broken): give it up
        in a task (its calls are answered, which may wait on the client)."""
        self.pool.client_link_down(link.backend)
        self.pool.pin(link.backend, -1)
        if self.open.get(link.backend) is link:
            self._spawn(self._lose(link, reason), f"link-lost-{link.backend}")

    def _from(self, link: BackendLink) -> Callable[[Message], Coroutine[Any, Any, None] | None]:
        """What ``link`` hands each message from its backend to: nothing is left to run
        when it was delivered at once (an update, written without waiting); else the
        coroutine that carries it out."""
        backend, routes, channel = link.backend, self.routes, self.channel
        links, gate, carry_out = self.open, self.gate, self._carry_out
        # looked up once per link, not per frame (this runs for every update an agent streams)
        rewrites, relays = gate.rewrites, routes.relays
        (frames, size), write = self.metrics.tallies(TO_CLIENT), channel.write

        def route(message: Message) -> Coroutine[Any, Any, None] | None:
            if links.get(backend) is not link:  # a link given up says nothing more
                return None
            if rewrites:
                message = gate.outbound(message, backend)
            if relays(message):
                # nearly every frame from a backend (an update): delivered as it came,
                # what carry_out would do with receive_backend's Deliver, with nothing built
                written = write(text := message.text)
                frames[0] += 1  # once it is written, as carried counts
                size[0] += utf8.size(text)
                if written:
                    return None
                return channel.send(text, message)
            return carry_out(routes.receive_backend(backend, message))

        return route

    async def _lose(
        self, link: BackendLink, reason: str, refused: ErrorObject | None = None
    ) -> None:
        """Give ``link`` up (once): withdraw its agent requests, answer its calls."""
        if self.open.get(link.backend) is not link:
            return
        del self.open[link.backend]
        link.close(reason)
        logger.warning(
            "link to backend %s ended: %s", link.backend, reason, extra={"outcome": reason}
        )
        finishing = self._carry_out(self.routes.backend_lost(link.backend, refused, reason))
        if finishing is not None:
            await finishing
