"""Split brain is seen, not hidden: a second active instance of a session, among scripted
backends on real sockets, is seen by the audit once the hint needs verifying
(tests/e2e/test_failover.py: the router's one promise against real processes)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fleet import RouterUnderTest, pulsing_async, start_router, start_scripted
from tests.support import WAIT, AcpClient, JsonObject, resume


async def _resume_through(router: RouterUnderTest, session_id: str) -> None:
    async with AcpClient.connect(router.url) as client:
        await client.initialize()
        assert (await resume(client, session_id)).get("result") == {}


@pytest.mark.parametrize(("verify_seconds", "seen"), [(0.0, True), (3600.0, False)])
async def test_a_second_active_instance_is_seen_by_the_audit_once_the_hint_needs_verifying(
    verify_seconds: float, seen: bool
) -> None:
    # the reference agent fences its sessions, so a second active copy takes a backend
    # that does not: "b" starts saying active too once the router trusts its hint on "a"
    rogue = {"active": False}

    async def always_active(session_id: str) -> JsonObject:
        return {"status": "active"}

    async def active_when_rogue(session_id: str) -> JsonObject:
        return {"status": "active" if rogue["active"] else "inactive"}

    async with (
        start_scripted("a", always_active) as first,
        start_scripted("b", active_when_rogue) as second,
        start_scripted("c", active_when_rogue) as third,
    ):
        pool = [("a", first.url), ("b", second.url), ("c", third.url)]
        names = [name for name, _ in pool]
        async with start_router(pool, cache={"verify_seconds": verify_seconds}) as router:
            await _resume_through(router, "sess_split")  # a fan-out finds it on "a"
            assert router.probes(names) == 3
            rogue["active"] = True
            audit = router.upstream.locator.audit
            audited = asyncio.Event()
            audit._audit = pulsing_async(audit._audit, audited)  # type: ignore[method-assign,assignment]
            async with asyncio.timeout(WAIT):
                audit_done = asyncio.ensure_future(audited.wait())
                await _resume_through(router, "sess_split")
                # the resumes themselves cost the fan-out and then the hint's probe alone
                assert router.metric("acp_router_probe_fanout_size_sum") == 3 + 1
                if seen:  # past verify_seconds: an audit asks the whole pool, off the path
                    await audit_done
                audit_done.cancel()
            assert router.probes(names) == (7 if seen else 4)
            detected = router.metric("acp_router_split_brain_detected_total")
            assert detected == (1 if seen else 0)
            assert router.metric("acp_router_audits_total", result="split") == detected
            hits = router.metric("acp_router_locate_cache_requests_total", result="hit")
            assert hits == (0 if seen else 1)
            if seen:  # a suspect now: the next resume asks everyone; the split was ended
                # ("a" is where the router found it: its home; "b" and "c" cannot close
                # sessions, so they are kept out of its resumes), so it is not seen again
                resolved = router.metric("acp_router_split_brain_resolved_total", how="kept_out")
                assert resolved == 2
                await _resume_through(router, "sess_split")
                assert router.metric("acp_router_probe_fanout_size_sum") == 3 + 1 + 3
                assert router.metric("acp_router_split_brain_detected_total") == 1
                resumed = [
                    b.backend_id
                    for b in (first, second, third)
                    if any(m.get("method") == "session/resume" for m in b.received)
                ]
                assert resumed == ["a"]  # every resume went to the home
