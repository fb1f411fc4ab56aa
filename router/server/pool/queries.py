"""The pool-wide requests the router answers itself: ``session/status`` (the I/O around
:class:`router.core.session_status.StatusRound`) and ``session/list`` (the pages asked of each
backend, merged by :func:`router.core.listing.listed`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from router.core import listing
from router.core.locate import Ask
from router.core.session_status import StatusRound
from router.protocol import acp
from router.protocol.errors import BackendRefused
from router.protocol.ids import BackendId, SessionId
from router.server.pool import waits
from router.server.pool.whereabouts import Whereabouts


class Queries:
    def __init__(self, where: Whereabouts) -> None:
        self._pool = where.pool
        self._where = where

    async def status(self, session_id: SessionId) -> dict[str, Any]:
        """The pool's ``session/status`` result (:class:`router.core.session_status.StatusRound`),
        once the backends a router just started has not heard from have answered
        (:func:`router.server.pool.waits.first_contact`)."""
        await waits.first_contact(self._pool, "a status")
        round_ = StatusRound(self._where.snapshot(session_id))
        step = round_.start()
        while isinstance(step, Ask):
            step = round_.hear(await self._pool.probe_answers(step.backends, session_id))
        return step

    async def list_sessions(self, params: Any) -> dict[str, Any]:
        """``session/list`` over every backend that lists, merged behind one cursor.

        What each backend's page (or its failure) makes of the answer is
        :func:`router.core.listing.listed`'s: a refusal is the client's, in the backend's
        words; a page that did not come leaves that backend out. Like a status, it
        waits first for the backends a router just started has not heard from.
        """
        pool = self._pool
        await waits.first_contact(pool, "a session/list page")
        ready = pool.ready()
        listable = pool.fleet.listable(pool.now())
        page = listing.ListPage.from_params(params, ready)
        targets = page.asked(listable)
        answers = await asyncio.gather(
            *(self._list_one(b, page.backend_params(b)) for b in targets), return_exceptions=True
        )
        heard = dict(zip(targets, answers, strict=True))
        return listing.listed(page, heard, list(pool.links), listable)

    async def _list_one(self, backend: BackendId, params: dict[str, Any]) -> Any:
        """One backend's page. A list may take a while (it may read a store), so it gets
        ``probe.list_timeout_ms``; but a frozen backend is seen within the probe timeout,
        by a probe sent alongside, and left out of this page (TimeoutError), for no one
        else (:data:`router.core.listing.PAGE_PROBES_REPORT`)."""
        pool = self._pool
        timeout = pool.settings.probe.list_timeout_ms / 1000
        call = pool.links[backend].call(acp.SESSION_LIST, params, timeout=timeout)
        listing_call = asyncio.ensure_future(call)
        try:
            if not await pool.alive(backend, reports=listing.PAGE_PROBES_REPORT):
                raise TimeoutError(f"{backend} did not answer a probe")
            response = await listing_call
        finally:
            if listing_call.done() and not listing_call.cancelled():
                listing_call.exception()  # retrieved here or raised above
            else:
                listing_call.cancel()
        if response.error is not None:
            raise BackendRefused(backend, response.error)  # the client gets its own words
        return response.result
