"""The front door's checks on a client connection, and its bookkeeping, for both of
ACP's transport profiles: the WebSocket upgrade (:mod:`router.server.door.upgrade`) and
Streamable HTTP (:class:`HttpDoor`, :mod:`router.server.door.streamable_http`).

Every TCP connection is counted against the connection limits from the moment it is
accepted, and must send its request within ``router.handshake_timeout_ms``
(:mod:`router.server.door.accepting`: 429 or 503 past a limit, 503 near the open-file limit,
408 past the deadline). Before a client's connection is accepted (the upgrade, or the
POSTed ``initialize``), the door checks, in order: draining (503), the ``Origin`` (403),
the bearer token (401); then every client connection, of either profile, counts
against ``max_connections`` and the limit of its token (of its address without
``[auth]``), however few TCP connections carry it (idle HTTP ones make room), and
every later HTTP request of a connection is checked for origin and token again. The
decisions are :mod:`router.core.frontdoor`'s and :mod:`router.core.quotas`'s; this
module answers them and counts them. A reload that removes the token a client came
with closes its connection (1008, :func:`revoke`). docs/security.md ("The door's
checks") says what each check is for.
"""

from __future__ import annotations

import logging

from aiohttp import hdrs, web

from router.core import ending
from router.core.frontdoor import Admitted, Credentials
from router.core.quotas import Client, Seat, Taken
from router.protocol import acp
from router.server.connection.client import ClientConnection
from router.server.connection.client_links import ClientChannel
from router.server.door.accepting import take_place
from router.server.door.app_keys import (
    CLIENTS,
    DOOR,
    DRAINING,
    GATEKEEPER,
    HTTP_FRONT,
    METRICS,
    PLACES,
    TOKENS,
    UPSTREAM,
)
from router.server.door.http_connection import Entry

logger = logging.getLogger(__name__)


def place_client(app: web.Application, admission: Admitted, address: str) -> Seat | web.Response:
    """A place for a new client connection (given back with ``PLACES.give_back``), idle
    Streamable HTTP connections ending to make room; or the refusal: too many for that
    token or address (429), or in all (503)."""
    taken = take_place(app[METRICS], app[PLACES], Client.of(admission.principal, address))
    if not isinstance(taken, Taken):
        return web.Response(status=taken[0], text=taken[1])
    app[HTTP_FRONT].reclaim(taken.reclaimed)
    return taken.place


def refuse_while_draining(app: web.Application) -> web.Response | None:
    """503 while the router stops: new clients go to another replica."""
    if not app[DRAINING].is_set():
        return None
    app[METRICS].connections.labels("draining").inc()
    return web.Response(status=503, text="draining: connect to another replica\n")


def admit_client(
    app: web.Application,
    origin: str | None,
    authorization: str | None,
    address: str,
    *,
    opening: bool = True,
    refusal_opens: bool | None = None,
) -> Admitted | web.Response:
    """The door's decision on a request with these ``Origin`` and ``Authorization``
    headers from ``address`` (``opening``: a new connection), counted; a refusal is the
    response to send. A request of an open HTTP connection counts only its refusals,
    under ``acp_router_auth_total``; ``refusal_opens`` (by default ``opening``): whether
    a refusal counts among the connections refused, as a Streamable HTTP ``initialize``
    does (its connection starts only once it is admitted and read)."""
    admission = app[DOOR].admit(origin, authorization, app[TOKENS].credentials)
    metrics = app[METRICS]
    if isinstance(admission, Admitted):
        if opening:
            metrics.auth.labels(admission.auth.value).inc()
        return admission
    if admission.auth is not None:
        metrics.auth.labels(admission.auth.value).inc()
    if opening if refusal_opens is None else refusal_opens:
        metrics.connections.labels(admission.reason).inc()
    logger.debug("refused a client from %s: %s", address, admission.reason)
    headers = {hdrs.WWW_AUTHENTICATE: "Bearer"} if admission.status == 401 else None
    return web.Response(status=admission.status, text=admission.text, headers=headers)


def open_client(
    app: web.Application, channel: ClientChannel, admission: Admitted, address: str
) -> ClientConnection:
    """A client connection on ``channel``, counted among the open ones."""
    metrics = app[METRICS]
    metrics.connections.labels("accepted").inc()
    metrics.active_connections.inc()
    keeper = app[GATEKEEPER]
    gate = keeper.gate(address, admission.principal)
    connection = ClientConnection(
        channel, app[UPSTREAM], gate, clock=keeper.clock, principal=admission.principal
    )
    app[CLIENTS].add(connection)
    return connection


def close_client(app: web.Application, connection: ClientConnection) -> None:
    app[CLIENTS].discard(connection)
    app[METRICS].active_connections.dec()


class HttpDoor:
    """The door's checks and bookkeeping for Streamable HTTP connections
    (:class:`router.server.door.streamable_http.Door`): the WebSocket upgrade's, with the
    same counts; the origin and token come first, as they do on every HTTP request. An
    HTTP connection holds no TCP connection of its own (its requests and streams come
    and go), so client connections of both profiles are counted against
    ``max_connections`` and the limit per token or address (:func:`place_client`),
    besides the TCP connections that carry them."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def admit(self, request: web.Request) -> Admitted | web.Response:
        origin, authorization = (
            request.headers.get(hdrs.ORIGIN),
            request.headers.get(hdrs.AUTHORIZATION),
        )
        # a POST without a connection id can only be an initialize: a connection refused
        initialize = (
            request.method == hdrs.METH_POST and acp.CONNECTION_ID_HEADER not in request.headers
        )
        return admit_client(
            self.app, origin, authorization, request.remote or "unknown",
            opening=False, refusal_opens=initialize,
        )  # fmt: skip

    def enter(self, request: web.Request, admission: Admitted) -> Entry | web.Response:
        app = self.app
        refused = refuse_while_draining(app)
        if refused is not None:
            return refused
        app[METRICS].auth.labels(admission.auth.value).inc()
        address = request.remote or "unknown"
        place = place_client(app, admission, address)
        if isinstance(place, web.Response):
            return place
        return Entry(admission, address, place, app[PLACES])

    def start(self, channel: ClientChannel, entry: Entry) -> ClientConnection:
        return open_client(self.app, channel, entry.admission, entry.address)

    def finish(self, connection: ClientConnection, entry: Entry) -> None:
        close_client(self.app, connection)
        self.app[PLACES].give_back(entry.place)


def revoke(app: web.Application, credentials: Credentials | None) -> int:
    """Close (1008) every client connection that came with a token not in
    ``credentials`` (a reload removed it); how many. The closes run in the background,
    in tasks the clients' set owns until they end."""
    revoked = [c for c in app[CLIENTS] if ending.revoked(c.principal, credentials)]
    for connection in revoked:
        app[METRICS].connections.labels("revoked").inc()
        app[CLIENTS].closing(connection.shut(ending.REVOKED))
    if revoked:
        logger.warning("closed %d client connection(s) whose token a reload removed", len(revoked))
    return len(revoked)
