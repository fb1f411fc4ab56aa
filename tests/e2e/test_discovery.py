"""DNS discovery: a real ``acp-router serve`` subprocess asks a DNS server the test
controls, and real reference agents join and leave the pool as its answers change.

The agents listen on one port at several loopback addresses (127.0.0.2, .3, .4), as
a StatefulSet's pods do on theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from router.protocol.ids import BackendId
from router.server.operator.reload import Reloaded
from router.server.process.app import RELOADER
from tests.dns_server import DnsServer, dns_server
from tests.e2e.support import placed_by_a_new_client, router_url, scrape, sessions_on_each
from tests.fleet import start_router
from tests.support import AcpClient, CliProcess, answered_by, free_port, run_cli

NAME = "agents.test"


@contextlib.asynccontextmanager
async def agent_at(
    store: Path, address: str, port: int, agent_id: str
) -> AsyncIterator[CliProcess]:
    args = ("agent", "--listen", f"{address}:{port}", "--store", str(store), "--id", agent_id)
    async with run_cli(*args) as cli:
        assert cli.first_line.startswith(f"agent {agent_id} listening on "), cli.first_line
        yield cli


def discovery_toml(dns: DnsServer, port: int) -> str:
    return (
        '[router]\nlisten = "127.0.0.1:0"\n'
        "[control]\nreconnect_initial_ms = 20\nreconnect_max_ms = 200\ndown_grace_ms = 1000\n"
        f'[[discovery]]\ndns = "{NAME}"\nport = {port}\n'
        f'nameserver = "127.0.0.1:{dns.port}"\ninterval_seconds = 0.1\ntimeout_ms = 300\n'
    )


# -- a real router, a real DNS server, real agents ------------------------------------------


async def test_instances_join_and_leave_as_dns_answers_change(tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port("127.0.0.2")
    async with dns_server() as dns, contextlib.AsyncExitStack() as stack:
        agents = {
            n: await stack.enter_async_context(
                agent_at(store, f"127.0.0.{n + 1}", port, f"agent-{n}")
            )
            for n in (1, 2, 3)
        }
        dns.addresses[NAME] = ["127.0.0.2", "127.0.0.3"]
        dns.names = {"127.0.0.2": f"agent-1.{NAME}", "127.0.0.3": f"agent-2.{NAME}"}
        config = tmp_path / "router.toml"
        config.write_text(discovery_toml(dns, port))
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend agent-1 is up")
            await serve.wait_for_log("backend agent-2 is up")
            async with AcpClient.connect(url) as pinned:
                await pinned.initialize()
                owners = await sessions_on_each(pinned, 2)

                # agent-1 leaves DNS (its pod is not ready, or terminating), a third
                # instance appears with no reverse name: its address is its id
                seen = len(serve.stderr.lines)
                dns.addresses[NAME] = ["127.0.0.3", "127.0.0.4"]
                await serve.wait_for_log("backend 127.0.0.4 is up", start=seen)
                await serve.wait_for_log("backend agent-1 left DNS", start=seen)

                for owner, session_id in owners.items():
                    assert await answered_by(pinned, session_id) == owner
                placed = await placed_by_a_new_client(url, 6)
                assert "agent-1" not in placed, placed
                assert "agent-3" in placed, placed
            # agent-1 still runs the session: a resume goes there, not elsewhere
            async with AcpClient.connect(url) as back:
                await back.initialize()
                resumed = await back.request(
                    "session/resume", {"sessionId": owners["agent-1"], "cwd": "/work/project"}
                )
                assert "result" in resumed, resumed
                assert await answered_by(back, owners["agent-1"]) == "agent-1"

            # a DNS outage changes nothing: the last answer stands
            seen = len(serve.stderr.lines)
            dns.silent = True
            await serve.wait_for_log("lookup failed, keeping the last answer", start=seen)
            async with AcpClient.connect(url) as during:
                await during.initialize()
                assert await answered_by(during, await during.new_session()) != "agent-1"
            dns.silent = False

            # once agent-1 is gone (its process exited, and nothing reached it for the grace),
            # it is out
            seen = len(serve.stderr.lines)
            await agents[1].stop()
            await serve.wait_for_log("backend agent-1 left DNS and is gone", start=seen)
            samples = await scrape(url)
            assert ("acp_router_backend_up", (("backend", "agent-1"),)) not in samples
            assert samples[("acp_router_backend_up", (("backend", "127.0.0.4"),))] == 1
            lookups = {
                labels: value
                for (name, labels), value in samples.items()
                if name == "acp_router_discovery_lookups_total"
            }
            assert lookups[(("name", NAME), ("result", "ok"))] > 0
            assert lookups[(("name", NAME), ("result", "failed"))] >= 1

            # the whole service gone from DNS: its instances leave (the rest stay up)
            seen = len(serve.stderr.lines)
            dns.addresses[NAME] = []
            await serve.wait_for_log("discovery agents.test", start=seen)
            await serve.wait_for_log("backend agent-2 left DNS", start=seen)
            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text


async def test_a_reload_starts_and_stops_discovery(tmp_path: Path) -> None:
    store = tmp_path / "store"
    port = free_port("127.0.0.2")
    async with dns_server() as dns, agent_at(store, "127.0.0.2", port, "agent-1") as agent:
        dns.addresses[NAME] = ["127.0.0.2"]
        dns.names = {"127.0.0.2": f"agent-1.{NAME}"}
        static = agent.first_line.rsplit(" ", 1)[1]
        async with start_router([("static-1", static)]) as router:
            reloader = router.app[RELOADER]
            config = reloader.path = tmp_path / "router.toml"
            config.write_text(
                discovery_toml(dns, port) + f'[[backends]]\nid = "static-1"\nurl = "{static}"\n'
            )
            outcome = await reloader.reload()
            assert isinstance(outcome, Reloaded)
            await router.wait_backends(2)
            assert set(router.pool.links) == {"static-1", "agent-1"}

            # the table goes: its backend is leaving, not gone (it still runs)
            config.write_text(
                '[router]\nlisten = "127.0.0.1:0"\n'
                "[control]\nreconnect_initial_ms = 20\nreconnect_max_ms = 200\n"
                f'[[backends]]\nid = "static-1"\nurl = "{static}"\n'
            )
            assert isinstance(await reloader.reload(), Reloaded)
            assert router.pool.fleet.leaving == {BackendId("agent-1")}
            assert router.upstream.where.place_new() == "static-1"
