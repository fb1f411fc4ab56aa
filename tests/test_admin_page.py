"""The status page at /admin/ in headless Chromium: it loads, shows every backend and the
sessions attached through the router, and follows a drain (clicked on the page, or made
through the API by someone else)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.browser import CHROMIUM, open_page
from tests.fleet import backends_of, start_fleet, start_router
from tests.support import AcpClient
from tests.test_admin import ADMIN, BEARER, TOKEN

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's chromium)"
)

#: [backend, admin cell] of every row of the backends table
ROWS = "[...root.rows].map(r => [r.dataset.backend, r.querySelector('[data-field=admin]').textContent])"


async def test_the_status_page_shows_the_fleet_and_follows_a_drain(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 3) as agents,
        start_router(backends_of(agents), admin=ADMIN) as router,
        open_page(tmp_path / "profile") as page,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        session_id = await client.new_session()
        await page.open(f"{router.base}/admin/#token={TOKEN}")
        rows = await page.wait_for("#backends", f"root.rows.length === 3 && {ROWS}")
        assert rows == [["agent-1", "ready"], ["agent-2", "ready"], ["agent-3", "ready"]]
        # the token left the address bar
        assert await page.evaluate("location.hash") == ""
        status = await page.wait_for(
            "#sessions",
            f"root.rows.length === 1 && root.rows[0].dataset.session === '{session_id}'"
            " && root.rows[0].querySelector('[data-field=status]').textContent",
        )
        assert status == "active"
        # the client's one link shows as one pinned connection, on the session's backend
        pinned = await page.wait_for(
            "#backends",
            "[...root.rows].map(r => Number(r.querySelector('[data-field=connections]')"
            ".textContent)).reduce((sum, n) => sum + n, 0) === 1",
        )
        assert pinned is True

        # an operator clicks "drain" on agent-2
        await page.evaluate(
            "document.querySelector('button[data-backend=\"agent-2\"][data-action=drain]').click()"
        )
        rows = await page.wait_for("#backends", f"(rows => rows[1][1] === 'drain' && rows)({ROWS})")
        assert rows[1] == ["agent-2", "drain"]
        assert router.pool.draining() == {"agent-2"}

        # someone else puts agent-3 in maintenance through the API: the page follows
        async with aiohttp.ClientSession() as http:
            url = f"{router.base}/admin/backends/agent-3/maint"
            async with http.post(url, headers=BEARER) as answer:
                assert answer.status == 200
        rows = await page.wait_for("#backends", f"(rows => rows[2][1] === 'maint' && rows)({ROWS})")
        assert rows == [["agent-1", "ready"], ["agent-2", "drain"], ["agent-3", "maint"]]


async def test_without_a_token_the_page_asks_for_one(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        start_router(backends_of(agents), admin=ADMIN) as router,
        open_page(tmp_path / "profile") as page,
    ):
        await page.open(f"{router.base}/admin/")
        assert await page.evaluate("document.getElementById('login').hidden") is False
        assert await page.evaluate("document.getElementById('backends').rows.length") == 0
        await page.evaluate(
            f"document.getElementById('token').value = '{TOKEN}';"
            "document.getElementById('login').requestSubmit()"
        )
        rows = await page.wait_for("#backends", f"root.rows.length === 1 && {ROWS}")
        assert rows == [["agent-1", "ready"]]
