"""A backend URL must reach one process (docs/routing.md): one that reaches more (an L4
balancer with several processes behind it, a rolling update with surge) is reported, not
punished, and a real restart seen first on a client link is still a restart.

Real reference agents, a real relay playing the balancer (it sends new connections to
another process while the ones it has stay where they are), a real router.
"""

from __future__ import annotations

import signal
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from router.core.health import Health
from router.core.locate import AdminState
from router.protocol.ids import BackendId, SessionId
from router.server.operator.admin import set_admin_state
from tests.fleet import RouterUnderTest, start_router
from tests.relay import Relay, start_relay
from tests.support import AcpClient, answered_by, resume, start_agent

AGENT_1 = BackendId("agent-1")


def send_new_connections_to(balancer: Relay, url: str) -> None:
    """The balancer's next connections reach the process at ``url``; the open ones stay."""
    port = urlsplit(url).port
    assert port is not None
    balancer.target_port = port


def counted(router: RouterUnderTest, name: str) -> float:
    return router.metric(f"acp_router_backend_{name}_total", backend="agent-1")


async def test_a_url_that_reaches_two_processes_is_reported_not_punished(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        start_agent(tmp_path / "first", "agent-1") as first,  # the control link's process
        start_agent(tmp_path / "shared", "agent-1b") as second,  # behind the same URL
        start_agent(tmp_path / "shared", "agent-2") as beside,  # another backend, same store
        start_relay(first.url) as balancer,
        start_router([("agent-1", balancer.url), ("agent-2", beside.url)]) as router,
    ):
        send_new_connections_to(balancer, second.url)
        set_admin_state(router.pool, BackendId("agent-2"), AdminState.DRAIN)  # new: agent-1
        async with AcpClient.connect(router.url) as holder:
            await holder.initialize()
            session_id = await holder.new_session()
            assert await answered_by(holder, session_id) == "agent-1b"
            assert counted(router, "instance_mismatch") == 1
            assert "backend agent-1: a client link reached another process" in caplog.text
            assert counted(router, "restarts") == 0
            # not demoted (on the code before: unknown until its control link reconnected,
            # which it had no reason to do, and its hints gone)
            assert router.pool.health(AGENT_1) is Health.UP
            assert router.pool.directory.hint(SessionId(session_id)) is not None
            async with AcpClient.connect(router.url) as other:
                await other.initialize()
                # agent-1's control link (the first process) does not know the session,
                # agent-2 could load it from the store: the holder's live link says where
                # it runs, and it is not resumed beside it
                assert (await resume(other, session_id)).get("result") == {}
                assert await answered_by(other, session_id) == "agent-1b"
                # and agent-1 still takes new sessions (agent-2 takes none: drained)
                fresh = await other.new_session()
                assert await answered_by(other, fresh) == "agent-1b"


async def test_a_restart_seen_first_on_a_client_link_is_still_a_restart(tmp_path: Path) -> None:
    async with (
        start_agent(tmp_path / "old", "agent-1") as old,
        start_agent(tmp_path / "new", "agent-1") as new,
        start_relay(old.url) as balancer,
        start_router([("agent-1", balancer.url)], probe={"timeout_ms": 300}) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = SessionId(await client.new_session())
        assert router.pool.directory.hint(session_id) is not None
        # the old process hangs, and its replacement takes the new connections; the
        # control link's connection to the old one is still open
        old.cli.process.send_signal(signal.SIGSTOP)
        send_new_connections_to(balancer, new.url)
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            await client.new_session()  # its link reaches the new process first
            assert counted(router, "restarts") == 0  # not yet: reported
            assert counted(router, "instance_mismatch") == 1
            # its control link is checked again: the old process does not answer
            await router.wait_health("agent-1", Health.UNKNOWN)
            # it dies: its control link drops, and reconnects to the new process
            old.cli.process.kill()
            await router.wait_health("agent-1", Health.UP)
            assert counted(router, "restarts") == 1
            assert router.pool.directory.hint(session_id) is None  # its memory is gone
