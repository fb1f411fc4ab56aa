"""The operator's API under ``/admin/`` and its status page (docs/operations.md: Admin).

Off unless ``[admin]`` names tokens of its own: then every JSON endpoint wants
``Authorization: Bearer <admin token>`` (401 otherwise), compared in constant time as the
client tokens are (:mod:`router.core.frontdoor`). The page at ``/admin/`` is static (no
data in it); its script asks the JSON endpoints, with the token the operator gives it.

- ``GET /admin/backends``: each backend's id, url, weight, health, what an operator set
  (ready, drain, maint), sessions attached through this router, client connections
  holding a link to it, probe latency (the last
  and a moving average, :mod:`router.core.latency`).
- ``POST /admin/backends/{id}/drain|ready|maint``: see :func:`router.core.locate.decide`.
- ``GET /admin/sessions``: sessions attached through this router, each with the last
  ``session/status`` answer the router heard from its backend (status and, from v2
  agents, foreground state) and its age: read from memory, so a refresh costs no probe.
- ``GET /admin/sessions/{id}``: where a session is, from a fresh probe of every backend;
  nothing is attached or resumed.
- ``POST /admin/reload``: the same reload as SIGHUP (:mod:`router.server.operator.reload`).
"""

from __future__ import annotations

import importlib.resources
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web

from router.core.frontdoor import AuthOutcome
from router.core.locate import AdminState
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.ids import BackendId, SessionId
from router.server.door.auth import TokenSource
from router.server.operator.reload import Reloader, ReloadRefused
from router.server.pool.backends import Pool

logger = logging.getLogger(__name__)

#: sessions the page lists
MAX_LISTED_SESSIONS = 200

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Admin:
    """The admin endpoints over a running pool; ``reloader`` is looked up per call
    (it exists once the pool runs)."""

    def __init__(
        self,
        tokens: TokenSource,
        pool: Callable[[], Pool],
        reloader: Callable[[], Reloader],
    ) -> None:
        self._tokens = tokens
        self._pool = pool
        self._reloader = reloader

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin", _redirect_to_page)
        app.router.add_get("/admin/", _page)
        app.router.add_get("/admin/backends", self._guarded(self._backends))
        app.router.add_post("/admin/backends/{backend}/{state}", self._guarded(self._set_state))
        app.router.add_get("/admin/sessions", self._guarded(self._sessions))
        app.router.add_get("/admin/sessions/{session}", self._guarded(self._session))
        app.router.add_post("/admin/reload", self._guarded(self._reload))

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            credentials = self._tokens.credentials
            assert credentials is not None  # routes exist only with [admin]
            outcome, _ = credentials.check(request.headers.get(hdrs.AUTHORIZATION))
            if outcome is not AuthOutcome.OK:
                return _error(401, "an admin token is needed", {hdrs.WWW_AUTHENTICATE: "Bearer"})
            return await handler(request)

        return guarded

    async def _backends(self, request: web.Request) -> web.Response:
        pool = self._pool()
        return web.json_response({"backends": [_backend(pool, b) for b in pool.links]})

    async def _set_state(self, request: web.Request) -> web.Response:
        pool = self._pool()
        backend = BackendId(request.match_info["backend"])
        try:
            state = AdminState(request.match_info["state"])
        except ValueError:
            return _error(404, "the states are ready, drain and maint")
        try:
            set_admin_state(pool, backend, state)
        except KeyError:
            return _error(404, f"no backend {backend!r} in the pool")
        return web.json_response(_backend(pool, backend))

    async def _sessions(self, request: web.Request) -> web.Response:
        """Sessions attached through this router, each with what its last probe heard
        (``ageSeconds`` ago): a refresh of the page costs no probe."""
        pool = self._pool()
        directory = pool.directory
        attached = list(directory.attachments.items())[:MAX_LISTED_SESSIONS]
        now = pool.now()
        rows = []
        for session, where in attached:
            backend = next(iter(where))
            heard = (directory.heard.get(session) or {}).get(backend)
            rows.append({"sessionId": session, "backend": backend, **_heard(heard, now)})
        truncated = len(directory.attachments) > len(rows)
        return web.json_response({"sessions": rows, "truncated": truncated})

    async def _session(self, request: web.Request) -> web.Response:
        pool = self._pool()
        session = SessionId(request.match_info["session"])
        answers = await pool.probe_answers(pool.ready(), session)
        active = [b for b, answer in answers.items() if answer.result is ProbeResult.ACTIVE]
        body = {
            "sessionId": session,
            "active": active,
            "attachedHere": sorted(pool.directory.attachments.get(session, {})),
            "backends": {b: _answer(answer) for b, answer in answers.items()},
            "unreachable": pool.unreachable(),
        }
        return web.json_response(body)

    async def _reload(self, request: web.Request) -> web.Response:
        outcome = await self._reloader().reload()
        return web.json_response(
            outcome.as_json(), status=400 if isinstance(outcome, ReloadRefused) else 200
        )


def _heard(heard: tuple[StatusAnswer, float] | None, now: float) -> dict[str, Any]:
    """A session's row: what its backend last said, and how long ago (None: nothing was
    heard yet, or its backend cannot be asked: it is attached here, that is all)."""
    if heard is None:
        return {"status": "attached", "ageSeconds": None}
    answer, when = heard
    return {**_answer(answer), "ageSeconds": round(now - when, 3)}


def _answer(answer: StatusAnswer | None) -> dict[str, Any]:
    if answer is None:
        return {"status": "attached"}  # attached here, and its backend cannot say more
    if answer.state is None:
        return {"status": answer.result.value}
    return {"status": answer.result.value, "state": dict(answer.state)}


def _backend(pool: Pool, backend: BackendId) -> dict[str, Any]:
    spec = pool.links[backend].spec
    last = pool.prober.seconds.get(backend)
    average = pool.prober.average.get(backend)
    return {
        "id": backend,
        "url": spec.url,
        "weight": spec.weight,
        "health": pool.health(backend).value,
        "admin": pool.fleet.admin.get(backend, AdminState.READY).value,
        "leaving": backend in pool.fleet.leaving,
        "attachedSessions": pool.directory.attached.get(backend, 0),
        "pinnedConnections": pool.directory.pinned.get(backend, 0),
        "probeLatencyMs": _milliseconds(last),
        "probeLatencyAverageMs": _milliseconds(average),
    }


def _milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


async def _redirect_to_page(request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect("/admin/")


async def _page(request: web.Request) -> web.Response:
    # no-store: the page is tiny, and an old copy must never outlive an upgrade
    return web.Response(
        text=PAGE, content_type="text/html", headers={hdrs.CACHE_CONTROL: "no-store"}
    )


#: the status page: plain HTML and a little script, shipped in the package
PAGE = importlib.resources.files("router.server.operator").joinpath("admin.html").read_text("utf-8")


def set_admin_state(pool: Pool, backend: BackendId, state: AdminState) -> None:
    """Drain a backend, put it in maintenance or make it ready again (the rules are
    :func:`router.core.locate.decide`'s and :meth:`router.core.fleet.Fleet.draining`'s).

    Raises:
        KeyError: ``backend`` is not in the pool.
    """
    if backend not in pool.links:
        raise KeyError(backend)
    pool.fleet.set_admin(backend, state)
    logger.warning("backend %s set to %s by an operator", backend, state.value)
    for each in AdminState:
        pool.metrics.backend_admin_state.labels(backend, each.value).set(each is state)
