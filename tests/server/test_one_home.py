"""A session has one home, and the router says where it is truthfully (issue 15), against
scripted backends on real sockets: a resume whose link is lost, and a backend's own
``session/list`` error or silence (tests/e2e/test_one_home.py: on real agents)."""

from __future__ import annotations

import asyncio

from tests.fleet import CLOSE, error_reply, start_router, start_scripted
from tests.support import WAIT, AcpClient, JsonObject, resume


async def test_a_resume_whose_link_closes_is_counted_as_link_lost() -> None:
    async def inactive(session_id: str) -> JsonObject:
        return {"status": "inactive"}

    async with start_scripted("a", inactive) as backend:
        backend.scripted["session/resume"] = [CLOSE]
        async with start_router([("a", backend.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                answer = await resume(client, "sess_1")
                assert answer["error"]["code"] == -32013, answer
            assert router.metric("acp_router_resume_total", backend="a", result="link_lost") == 1


async def test_session_list_passes_a_backends_own_error_on() -> None:
    async def inactive(session_id: str) -> JsonObject:
        return {"status": "inactive"}

    async with (
        start_scripted("a", inactive) as fine,
        start_scripted("b", inactive) as refusing,
    ):
        refusing.scripted["session/list"] = [error_reply(-32042, "listing is switched off")]
        async with start_router([("a", fine.url), ("b", refusing.url)]) as router:
            await router.wait_backends(2)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                answer = await client.request("session/list", {})
            # on the old main: -32603 with the backend's message only
            assert answer["error"]["code"] == -32042, answer
            assert answer["error"]["message"] == "listing is switched off"
            assert answer["error"]["data"] == {"backend": "b"}
            assert router.metric("acp_router_client_errors_total", code="-32603") == 0


async def test_session_list_names_a_backend_that_does_not_answer_in_time() -> None:
    async def inactive(session_id: str) -> JsonObject:
        return {"status": "inactive"}

    async with (
        start_scripted("a", inactive) as fine,
        start_scripted("b", inactive) as silent,
    ):
        silent.scripted["session/list"] = []  # never answers
        probe = {"timeout_ms": 100, "list_timeout_ms": 200}
        async with start_router([("a", fine.url), ("b", silent.url)], probe=probe) as router:
            await router.wait_backends(2)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                async with asyncio.timeout(WAIT):
                    answer = await client.request("session/list", {})
            assert answer["result"]["_meta"] == {"unlistedBackends": ["b"]}, answer
