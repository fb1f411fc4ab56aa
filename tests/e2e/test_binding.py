"""Sessions bound to the token that created them, end to end: two router replicas that
share nothing but the session secret, in front of the same reference agents
(tests/server/test_binding.py: the new-session limits per address)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.core.frontdoor import principal_of
from router.core.ownership import SessionSeal
from tests.fleet import backends_of, start_fleet, start_router
from tests.support import CWD, AcpClient, JsonObject, text_chunks

ALICE, BOB = "alice-token-7c1e", "bob-token-f20a"
SECRET = "a session secret every replica shares"


def bound(secret: str = SECRET) -> dict[str, Any]:
    return {"tokens": [ALICE, BOB], "bind_sessions": True, "session_secret": secret}


async def call(client: AcpClient, method: str, session_id: str, **params: Any) -> JsonObject:
    return await client.request(method, {"sessionId": session_id, **params})


async def test_a_session_bound_to_one_token_is_unknown_to_another_on_any_replica(
    tmp_path: Path,
) -> None:
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), auth=bound()) as one,
        start_router(backends_of(agents), auth=bound()) as other,
    ):
        async with AcpClient.connect(one.url, token=ALICE) as alice:
            init = await alice.initialize()
            assert "list" not in init["result"]["agentCapabilities"]["sessionCapabilities"]
            session_id = await alice.new_session(CWD)
            agent_id, _, mac = session_id.rpartition(".")
            assert agent_id.startswith("sess_"), session_id  # the agent's id, sealed
            assert len(mac) == 22
            alice.drain_incoming()
            assert (await alice.prompt(session_id, "hi"))["result"] == {"stopReason": "end_turn"}
            updates = [m for m in alice.drain_incoming() if m.get("method") == "session/update"]
            assert updates
            assert {m["params"]["sessionId"] for m in updates} == {session_id}

        async with AcpClient.connect(other.url, token=BOB) as bob:
            await bob.initialize()
            for name in (session_id, agent_id):  # neither the sealed id nor the agent's own
                refusals = [
                    await call(bob, "session/resume", name, cwd=CWD),
                    await call(bob, "session/load", name, cwd=CWD, mcpServers=[]),
                    await call(bob, "session/status", name),
                    await call(bob, "session/prompt", name, prompt=[]),
                    await call(bob, "session/close", name),
                ]
                for refusal in refusals:
                    assert refusal["error"] == {
                        "code": -32002,
                        "message": "Resource not found",
                        "data": {"sessionId": name},
                    }, refusal
            # what Bob sees is what an unknown session looks like to its owner
            nobody = SessionSeal(SECRET.encode()).seal(principal_of(BOB), "sess_nobody")
            unknown = await call(bob, "session/resume", nobody, cwd=CWD)
            assert unknown["error"] == {
                "code": -32002,
                "message": "Resource not found",
                "data": {"sessionId": nobody},
            }
            listed = await bob.request("session/list", {})
            assert listed["error"]["code"] == -32601

        async with AcpClient.connect(other.url, token=ALICE) as alice:
            await alice.initialize()
            assert (await call(alice, "session/status", session_id))["result"] == {
                "status": "active"
            }
            assert (await call(alice, "session/resume", session_id, cwd=CWD))["result"] == {}
            alice.drain_incoming()
            assert (await alice.prompt(session_id, "again"))["result"] == {"stopReason": "end_turn"}
            chunks = text_chunks(alice.drain_incoming())
            assert any(text.endswith("again") for _, text in chunks), chunks
            assert (await call(alice, "session/close", session_id))["result"] == {}

    # a router started afresh with the same secret still knows whose the session is
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), auth=bound()) as restarted,
    ):
        async with AcpClient.connect(restarted.url, token=ALICE) as alice:
            await alice.initialize()
            assert (await call(alice, "session/resume", session_id, cwd=CWD))["result"] == {}
        async with AcpClient.connect(restarted.url, token=BOB) as bob:
            await bob.initialize()
            assert (await call(bob, "session/resume", session_id, cwd=CWD))["error"]["code"] == (
                -32002
            )
    # and a router with another secret knows it for nobody
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), auth=bound("another secret, sixteen+")) as stranger,
        AcpClient.connect(stranger.url, token=ALICE) as alice,
    ):
        await alice.initialize()
        assert (await call(alice, "session/resume", session_id, cwd=CWD))["error"]["code"] == (
            -32002
        )
