"""Reloading the configuration on SIGHUP, on a real ``acp-router serve`` subprocess with
real reference agents: backends join, leave and change weight while pinned clients stay
connected and answered; a bad file is refused and the running configuration keeps
routing."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from router.core.health import Health
from router.protocol.acp import ProbeResult
from router.protocol.ids import BackendId, SessionId
from router.server.operator.reload import Reloaded, ReloadRefused
from router.server.process.app import RELOADER
from tests.e2e.support import (
    LISTEN,
    placed_by_a_new_client,
    post_reload,
    router_url,
    scrape,
    sessions_on_each,
    upgrade_status,
    write_config,
)
from tests.fleet import (
    RouterUnderTest,
    backends_of,
    router_settings,
    start_fleet,
    start_router,
    start_scripted,
)
from tests.support import (
    WAIT,
    AcpClient,
    CliProcess,
    answered_by,
    run_cli,
)


def reloads(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], result: str) -> float:
    return samples[("acp_router_config_reloads_total", (("result", result),))]


async def hang_up(serve: CliProcess, expect: str) -> str:
    """Send SIGHUP and wait for the log line that says how the reload went."""
    seen = len(serve.stderr.lines)
    serve.process.send_signal(signal.SIGHUP)
    return await serve.wait_for_log(expect, start=seen)


async def test_sighup_adds_removes_and_reweights_backends_without_dropping_pinned_clients(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path / "store", 3) as agents:
        one, two, three = agents
        config = write_config(tmp_path / "router.toml", [one, two])
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            for agent in (one, two):
                await serve.wait_for_log(f"backend {agent.agent_id} is up")
            async with AcpClient.connect(url) as pinned:
                await pinned.initialize()
                owners = await sessions_on_each(pinned, 2)
                assert set(owners) == {"agent-1", "agent-2"}

                write_config(config, [two, three], weights={"agent-2": 3.0})
                line = await hang_up(serve, "config reloaded")
                assert "added agent-3" in line, line
                assert "removed agent-1" in line, line
                assert "reweighted agent-2 (weight 3)" in line, line
                await serve.wait_for_log("backend agent-3 is up")

                # the pinned client's sessions, agent-1's included, answer on the same socket
                for owner, session_id in owners.items():
                    assert await answered_by(pinned, session_id) == owner

                placed = await placed_by_a_new_client(url, 6)
                assert "agent-1" not in placed, placed
                assert "agent-3" in placed, placed
                # still the same connection: nothing closed it
                assert await answered_by(pinned, owners["agent-1"]) == "agent-1"

                samples = await scrape(url)
                assert reloads(samples, "ok") == 1
                assert reloads(samples, "refused") == 0
                assert samples[("acp_router_backend_weight", (("backend", "agent-2"),))] == 3
                assert ("acp_router_backend_up", (("backend", "agent-1"),)) not in samples
                assert samples[("acp_router_backend_up", (("backend", "agent-3"),))] == 1
            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text
        assert "ERROR" not in serve.stderr.text, serve.stderr.text


async def test_a_bad_file_is_refused_and_the_running_config_keeps_routing(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        one, two = agents
        config = write_config(tmp_path / "router.toml", [one])
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend agent-1 is up")
            async with AcpClient.connect(url) as client:
                await client.initialize()
                session_id = await client.new_session()

                # an unknown key, with a second backend the file would add
                write_config(config, [one, two], extra="wieght = 2")
                line = await hang_up(serve, "config reload refused")
                assert "router: unknown key 'wieght'" in line, line
                # not TOML at all
                config.write_text("[router\n")
                line = await hang_up(serve, "config reload refused")
                assert "not valid TOML" in line, line

                assert await answered_by(client, session_id) == "agent-1"
                assert await answered_by(client, await client.new_session()) == "agent-1"
                samples = await scrape(url)
                assert reloads(samples, "refused") == 2
                assert reloads(samples, "ok") == 0
                assert ("acp_router_backend_up", (("backend", "agent-2"),)) not in samples

                # fixed, with a key that cannot change at run time
                write_config(config, [one, two], router='listen = "127.0.0.1:1"')
                line = await hang_up(serve, "config reloaded")
                assert "added agent-2" in line, line
                await serve.wait_for_log("router.listen changed; it needs a restart")
                await serve.wait_for_log("backend agent-2 is up")
                assert await answered_by(client, session_id) == "agent-1"
                assert reloads(await scrape(url), "ok") == 1
            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text


# -- the same entry point, in process ------------------------------------------------------


def toml_backends(backends: list[tuple[str, str]], extra: str = "") -> str:
    tables = "".join(f'[[backends]]\nid = "{i}"\nurl = "{u}"\n{extra}' for i, u in backends)
    return f"[router]\n{LISTEN}\n[control]\nreconnect_initial_ms = 20\nreconnect_max_ms = 200\n{tables}"


async def test_without_a_config_file_a_reload_is_refused() -> None:
    async with start_fleet_router(1) as (router, _):
        outcome = await router.app[RELOADER].reload()
        assert isinstance(outcome, ReloadRefused)
        assert "without a config file" in outcome.reason
        assert outcome.as_json() == {"outcome": "refused", "reason": outcome.reason}
        assert outcome.http_status == 400
        assert router.metric("acp_router_config_reloads_total", result="refused") == 1


async def test_a_removed_backend_keeps_its_attached_sessions_until_they_end(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        backends = backends_of(agents)
        async with start_router(backends) as router:
            config = tmp_path / "router.toml"
            reloader = router.app[RELOADER]
            reloader.path = config
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                owners = await sessions_on_each(client, 2)
                config.write_text(toml_backends(backends[1:]))
                outcome = await reloader.reload()
                assert isinstance(outcome, Reloaded)
                assert outcome.http_status == 200
                assert outcome.as_json() == {
                    "outcome": "ok",
                    "added": [],
                    "removed": ["agent-1"],
                    "reweighted": [],
                    "replaced": [],
                    "restartRequired": [],
                }
                gone = BackendId("agent-1")
                assert router.pool.health(gone) is Health.GONE
                assert router.pool.url(gone) == backends[0][1]  # the pinned link's address
                assert router.metric("acp_router_attached_sessions", backend="agent-1") >= 1
                assert await answered_by(client, owners["agent-1"]) == "agent-1"
                # its status: the pool no longer asks agent-1, but the session is attached here
                status = await client.request("session/status", {"sessionId": owners["agent-1"]})
                assert status["result"] == {"status": "active"}, status
            await router.wait_detached()
            assert gone not in router.pool.directory.attached
            samples = router.metrics.registry.get_sample_value(
                "acp_router_attached_sessions", {"backend": "agent-1"}
            )
            assert samples is None

            # back again, at another address: a new link (replaced) after a move
            config.write_text(toml_backends([("agent-1", backends[0][1]), backends[1]]))
            assert isinstance(await reloader.reload(), Reloaded)
            await router.wait_backends(2)
            moved = backends[0][1].replace("127.0.0.1", "localhost")
            config.write_text(toml_backends([("agent-1", moved), backends[1]]))
            outcome = await reloader.reload()
            assert isinstance(outcome, Reloaded)
            assert outcome.as_json()["replaced"] == ["agent-1"]
            await router.wait_backends(2)
            assert router.pool.url(gone) == moved


async def reload_to(router: RouterUnderTest, backends: list[tuple[str, str]], folder: Path) -> Any:
    """Reload ``router`` from a config file in ``folder`` naming ``backends``; the outcome."""
    config = folder / "router.toml"
    config.write_text(toml_backends(backends))
    reloader = router.app[RELOADER]
    reloader.path = config
    return await reloader.reload()


async def test_a_backend_back_before_its_sessions_ended_keeps_its_series(tmp_path: Path) -> None:
    async with start_fleet_router(2) as (router, backends):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            await sessions_on_each(client, 2)
            removed = await reload_to(router, backends[1:], tmp_path)  # while attached
            assert isinstance(removed, Reloaded)
            back = await reload_to(router, backends, tmp_path)  # and back before they end
            assert isinstance(back, Reloaded)
            await router.wait_backends(2)
        await router.wait_detached()
        # a member again: its sessions ending leave its series at 0 (on the old main
        # the pool still counted it as gone and removed the series)
        assert router.metric("acp_router_attached_sessions", backend="agent-1") == 0
        assert BackendId("agent-1") in router.pool.directory.attached


async def test_client_tokens_are_reloaded_with_the_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("old-token\n")
    async with start_fleet_router(1, auth={"tokens_file": str(tokens)}) as (router, backends):
        reloader = router.app[RELOADER]
        config = reloader.path = tmp_path / "router.toml"
        auth = f'[auth]\ntokens_file = "{tokens}"\n'
        config.write_text(toml_backends(backends) + auth)
        tokens.write_text("new-token\n")
        assert isinstance(await reloader.reload(), Reloaded)
        assert await upgrade_status(router.url, "old-token") == 401
        assert await upgrade_status(router.url, "new-token") == 101

        tokens.unlink()  # a token file that cannot be read refuses the whole reload
        config.write_text(toml_backends(backends[:0] + backends) + auth)
        outcome = await reloader.reload()
        assert isinstance(outcome, ReloadRefused)
        assert "auth.tokens_file" in outcome.reason
        assert await upgrade_status(router.url, "new-token") == 101

        # a missing TLS file of a new backend refuses it too, naming the key
        wss = [("tls-1", "wss://127.0.0.1:1/acp")]
        config.write_text(toml_backends(wss, 'tls_ca = "/nonexistent.pem"\n') + auth)
        outcome = await reloader.reload()
        assert isinstance(outcome, ReloadRefused)
        assert "backends.tls-1.tls_ca" in outcome.reason
        assert list(router.pool.links) == ["agent-1"]


@contextlib.asynccontextmanager
async def start_fleet_router(
    count: int, *, auth: dict[str, Any] | None = None
) -> AsyncIterator[tuple[RouterUnderTest, list[tuple[str, str]]]]:
    with tempfile.TemporaryDirectory() as store:
        async with start_fleet(Path(store), count) as agents:
            backends = backends_of(agents)
            running = start_router(backends) if auth is None else start_router(backends, auth=auth)
            async with running as router:
                yield router, backends


async def test_post_admin_reload_is_the_same_reload_and_answers_its_outcome(
    tmp_path: Path,
) -> None:
    admin = '[admin]\ntokens = ["admin-secret"]\n'
    async with start_fleet(tmp_path / "store", 2) as agents:
        one, two = agents
        config = write_config(tmp_path / "router.toml", [one], extra=admin)
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend agent-1 is up")
            async with AcpClient.connect(url) as pinned:
                await pinned.initialize()
                session_id = await pinned.new_session()

                write_config(config, [one, two], extra=admin.replace("tokens", "tokenz"))
                status, body = await post_reload(url, "admin-secret")
                assert status == 400, body
                assert body["outcome"] == "refused"
                assert "admin: unknown key 'tokenz'" in body["reason"], body
                status, _ = await post_reload(url, None)  # the admin token guards it
                assert status == 401

                write_config(config, [two], extra=admin)
                status, body = await post_reload(url, "admin-secret")
                assert (status, body["added"], body["removed"]) == (200, ["agent-2"], ["agent-1"])
                assert body["restartRequired"] == []
                await serve.wait_for_log("backend agent-2 is up")
                assert await answered_by(pinned, session_id) == "agent-1"
                assert await placed_by_a_new_client(url, 2) == ["agent-2", "agent-2"]
                samples = await scrape(url)
                assert (reloads(samples, "ok"), reloads(samples, "refused")) == (1, 1)
            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text


async def test_a_backend_removed_while_its_probe_runs_leaves_no_latency_behind() -> None:
    asked = asyncio.Event()

    async def stalls(session_id: str) -> dict[str, Any] | None:
        asked.set()
        await asyncio.Event().wait()  # silent: still owed when the backend is removed
        return None

    async def knows(session_id: str) -> dict[str, Any] | None:
        return {"status": "inactive"}

    async with (
        start_scripted("slow", stalls) as slow,
        start_scripted("fast", knows) as fast,
        start_router([("slow", slow.url), ("fast", fast.url)]) as router,
    ):
        pool = router.pool
        probing = asyncio.create_task(
            pool.probe_answers([BackendId("slow"), BackendId("fast")], SessionId("sess_x"))
        )
        await asyncio.wait_for(asked.wait(), WAIT)
        pool.set_static(router_settings([("fast", fast.url)]))
        answers = await asyncio.wait_for(probing, WAIT)
        assert answers[BackendId("fast")].result is ProbeResult.INACTIVE
        assert set(pool.prober.seconds) == set(pool.prober.average) == {"fast"}
