"""The link a resume will most likely need opens while the resume's probe runs, not after
(issue 24): real router, real WebSocket backends on loopback, a probe held unanswered.

Two scripted backends; a first client resumes a session on ``home`` (the router learns
it lives there). A second client's resume of it probes ``home`` first, and ``home``
holds that probe: while it is held, the second client's own link to ``home`` must open
(its replayed ``initialize`` arrives), since that is where the resume will go. Then the
probe is answered and the resume lands there, on that link.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fleet import ScriptedBackend, start_router, start_scripted
from tests.support import WAIT, AcpClient

SESSION = "sess-ahead"


def _initializes(backend: ScriptedBackend) -> int:
    return sum(1 for message in backend.received if message.get("method") == "initialize")


async def test_the_link_a_resume_will_need_opens_while_its_probe_runs() -> None:
    held = asyncio.Event()  # the second probe of SESSION is waiting
    release = asyncio.Event()
    probes = 0

    async def home_status(session_id: str) -> dict[str, Any] | None:
        nonlocal probes
        if session_id != SESSION:
            return None
        probes += 1
        if probes > 1:  # the second client's locate: held until the test lets it go
            held.set()
            await release.wait()
        return {"status": "active"}

    async def elsewhere(session_id: str) -> dict[str, Any] | None:
        return None  # -32002: it does not know the session

    async with (
        start_scripted("home", home_status) as home,
        start_scripted("other", elsewhere) as other,
        start_router([("home", home.url), ("other", other.url)]) as router,
    ):
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            resumed = await first.request("session/resume", {"sessionId": SESSION, "cwd": "/w"})
            assert "result" in resumed, resumed
        before = _initializes(home)  # the control link's and the first client's link's

        async with AcpClient.connect(router.url) as second:
            await second.initialize()
            asking = asyncio.create_task(
                second.request("session/resume", {"sessionId": SESSION, "cwd": "/w"})
            )
            async with asyncio.timeout(WAIT):
                await held.wait()
                # the probe is held: the second client's link to home opens meanwhile
                await home.until(lambda: _initializes(home) > before)
            assert _initializes(home) == before + 1
            assert not asking.done()  # still waiting for the probe
            release.set()
            answer = await asking
            assert "result" in answer, answer
        resumes = [m for m in home.received if m.get("method") == "session/resume"]
        assert len(resumes) == 2  # both clients' resumes landed on home
        assert not [m for m in other.received if m.get("method") == "session/resume"]
