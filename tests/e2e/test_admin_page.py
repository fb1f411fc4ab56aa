"""The status page at /admin/ in headless Chromium: it loads, shows every backend and the
sessions attached through the router, and follows a drain (clicked on the page, or made
through the API by someone else). Without a token, or with one the router refuses, it
shows a form that asks for one instead of empty tables."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from tests.browser import CHROMIUM, Page, open_page
from tests.e2e.support import ADMIN, ADMIN_BEARER, ADMIN_TOKEN
from tests.fleet import backends_of, start_fleet, start_router
from tests.support import AcpClient

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
        await page.open(f"{router.base}/admin/#token={ADMIN_TOKEN}")
        rows = await page.wait_for("#backends", f"root.rows.length === 3 && {ROWS}")
        assert rows == [["agent-1", "ready"], ["agent-2", "ready"], ["agent-3", "ready"]]
        # the token left the address bar
        assert await page.evaluate("location.hash") == ""
        status = await page.wait_for(
            "#sessions",
            f"root.rows.length === 1 && root.rows[0].dataset.session === '{session_id}'"
            " && root.rows[0].querySelector('[data-field=status]').textContent",
        )
        assert status.startswith("active ("), status  # what the router last heard, and when
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
        assert router.pool.fleet.draining() == {"agent-2"}

        # someone else puts agent-3 in maintenance through the API: the page follows
        async with aiohttp.ClientSession() as http:
            url = f"{router.base}/admin/backends/agent-3/maint"
            async with http.post(url, headers=ADMIN_BEARER) as answer:
                assert answer.status == 200
        rows = await page.wait_for("#backends", f"(rows => rows[2][1] === 'maint' && rows)({ROWS})")
        assert rows == [["agent-1", "ready"], ["agent-2", "drain"], ["agent-3", "maint"]]


#: what the page shows: [form visible, fleet visible, the status line, the form's reason]
VIEW = (
    "[!document.getElementById('login').hidden, !document.getElementById('fleet').hidden,"
    " document.getElementById('status').textContent, document.getElementById('why').textContent]"
)


async def submit_token(page: Page, token: str) -> None:
    await page.evaluate(
        f"document.getElementById('token').value = {json.dumps(token)};"
        "document.getElementById('login').requestSubmit()"
    )


async def test_without_a_token_the_page_asks_for_one(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        start_router(backends_of(agents), admin=ADMIN) as router,
        open_page(tmp_path / "profile") as page,
    ):
        await page.open(f"{router.base}/admin/")
        form, fleet, status, why = await page.evaluate(VIEW)
        assert (form, fleet) == (True, False)  # the form instead of empty tables
        assert "loading" not in status
        assert "admin token" in why
        assert await page.evaluate("document.getElementById('backends').rows.length") == 0
        await submit_token(page, ADMIN_TOKEN)
        rows = await page.wait_for("#backends", f"root.rows.length === 1 && {ROWS}")
        assert rows == [["agent-1", "ready"]]
        form, fleet, status, _ = await page.evaluate(VIEW)
        assert (form, fleet) == (False, True)
        assert status.startswith("updated ")


async def test_a_refused_token_brings_the_form_back(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        start_router(backends_of(agents), admin=ADMIN) as router,
        open_page(tmp_path / "profile") as page,
    ):
        # a stale or mistyped token in the link: the router answers 401
        await page.open(f"{router.base}/admin/#token=not-the-token")
        why = await page.wait_for("#login", "root.querySelector('#why').textContent")
        assert "refused" in why
        assert "401" in why
        form, fleet, status, _ = await page.evaluate(VIEW)
        assert (form, fleet) == (True, False)
        assert "loading" not in status
        # the refused token is forgotten, so the page stops asking with it
        assert await page.evaluate("sessionStorage.getItem('acp-router-admin')") is None
        assert await page.evaluate("location.hash") == ""

        await submit_token(page, "still-wrong")
        why = await page.wait_for(
            "#login", "root.querySelector('#why').textContent.includes('refused') && !root.hidden"
        )
        assert why is True
        await submit_token(page, ADMIN_TOKEN)
        rows = await page.wait_for("#backends", f"root.rows.length === 1 && {ROWS}")
        assert rows == [["agent-1", "ready"]]
        assert (await page.evaluate(VIEW))[:2] == [False, True]
