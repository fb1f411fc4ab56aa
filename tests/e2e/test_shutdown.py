"""Stopping the router as an operator does: real ``acp-router serve`` processes, real signals.

SIGTERM drains (``/readyz`` 503, no new clients) for ``drain_seconds``, then closes the
clients with 1012, spread over ``close_spread_seconds``; a second SIGTERM cuts that short.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.server.door.app_keys import CLIENTS, OpenClients
from router.server.process.serving import drain
from router.server.process.shutdown import close_spread
from tests.e2e.support import router_url, wait_backends_up, write_config
from tests.fleet import ScriptedBackend, start_fleet, start_router, start_scripted
from tests.relay import Relay, start_relay
from tests.support import WAIT, AcpClient, JsonObject, run_cli

SERVICE_RESTART = 1012


async def closed_at(client: AcpClient) -> float:
    """When the router closed ``client``, after checking it closed with 1012."""
    async with asyncio.timeout(WAIT):
        await client.ws.wait_closed()
    assert client.ws.close_code == SERVICE_RESTART, client.ws.close_code
    return time.monotonic()


async def test_with_nothing_in_flight_sigterm_stops_at_once_and_says_so(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", agents)
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            router.process.send_signal(signal.SIGTERM)
            # generous: it takes a few hundredths of a second (issue 26: it took 1.6 s)
            async with asyncio.timeout(WAIT / 2):
                assert await router.process.wait() == 0
            assert await router.stop() == 0  # the logs read to their end
        last = router.stderr.lines[-2:]
        assert last[0].rstrip().endswith("router.server.process.shutdown: stopping"), last
        assert last[1].rstrip().endswith("router.server.process.serving: stopped"), last


#: a process whose event loop gets SIGTERM just after it puts SIGTERM's default action
#: back, as a stop signal that comes while the router lets go of its handlers does
LATE_SIGNAL = """
import asyncio, os, signal
from router.server.process.shutdown import StopSignals

class LateSignalLoop(asyncio.SelectorEventLoop):
    def remove_signal_handler(self, sig):
        removed = super().remove_signal_handler(sig)
        if sig == signal.SIGTERM:
            os.kill(os.getpid(), signal.SIGTERM)
        return removed

async def main():
    signals = StopSignals()
    with signals.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        await signals.stop.wait()
    print("stopped", flush=True)

with asyncio.Runner(loop_factory=LateSignalLoop) as runner:
    runner.run(main())
"""


async def test_a_signal_while_the_handlers_are_let_go_does_not_kill_a_stopping_process() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LATE_SIGNAL, stdout=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(WAIT):
        output, _ = await process.communicate()
    assert (process.returncode, output) == (0, b"stopped\n")  # on the old code: -15, b""


async def test_sigterm_closes_clients_one_by_one_over_the_spread_window(tmp_path: Path) -> None:
    window = 1.5
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml",
            agents,
            f'listen = "127.0.0.1:0"\ndrain_seconds = 0.0\nclose_spread_seconds = {window}',
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with (
                AcpClient.connect(url) as first,
                AcpClient.connect(url) as second,
                AcpClient.connect(url) as third,
            ):
                clients = (first, second, third)
                for client in clients:
                    await client.initialize()
                router.process.send_signal(signal.SIGTERM)
                times = sorted(await asyncio.gather(*(closed_at(c) for c in clients)))
                # three clients over 1.5 s: one at once, then one every 0.5 s
                assert times[-1] - times[0] >= window * 2 / 3 * 0.9, times
            # another SIGTERM while it exits (as stop() sends) still ends in a clean exit
            assert await router.stop() == 0
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_a_second_sigterm_cuts_the_drain_short(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml", agents, 'listen = "127.0.0.1:0"\ndrain_seconds = 600.0'
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            base = url.removesuffix("/acp").replace("ws://", "http://")
            async with AcpClient.connect(url) as client:
                await client.initialize()
                router.process.send_signal(signal.SIGTERM)
                await router.wait_for_log("draining for 600.0 s")
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{base}/readyz") as ready:
                        assert ready.status == 503
                    # no new clients while draining, on either profile of the transport
                    with pytest.raises(aiohttp.WSServerHandshakeError) as upgrade:
                        await http.ws_connect(url)
                    assert upgrade.value.status == 503
                    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
                    async with http.post(f"{base}/acp", json=initialize) as refused:
                        assert refused.status == 503
                # still connected and served while the replica drains
                assert (await client.request("session/list", {})).get("result") is not None
                router.process.send_signal(signal.SIGTERM)
                await closed_at(client)
            async with asyncio.timeout(WAIT):  # far less than the 600 s drain
                assert await router.process.wait() == 0
        assert "second stop signal" in router.stderr.text
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def _turn_running(
    client: AcpClient, session_id: str, seconds: int
) -> asyncio.Task[JsonObject]:
    """A ``/slow`` turn on ``session_id``, once it is streaming."""
    turn = asyncio.create_task(client.prompt(session_id, f"/slow {seconds}", timeout=WAIT * 3))
    await client.next_incoming()
    return turn


async def test_a_stop_answers_every_request_in_flight_before_closing(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        config = write_config(
            tmp_path / "router.toml", agents, 'listen = "127.0.0.1:0"\ndrain_seconds = 0.0'
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(AcpClient.connect(url)) for _ in range(5)
                ]
                turns = []
                for client in clients:
                    await client.initialize()
                    turns.append(await _turn_running(client, await client.new_session(), 60))
                router.process.send_signal(signal.SIGTERM)
                # five answers (on the old main: none, and the editors waited forever) ...
                for turn in turns:
                    answer = await turn
                    assert answer["error"]["code"] == -32013, answer
                    assert answer["error"]["data"]["retryable"] is True
                    assert answer["error"]["data"]["reason"] == "the router is stopping"
                # ... then five 1012 closes
                await asyncio.gather(*(closed_at(client) for client in clients))
            assert await router.stop() == 0
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_a_turn_that_finishes_within_the_drain_finishes(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml", agents, 'listen = "127.0.0.1:0"\ndrain_seconds = 3.0'
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with AcpClient.connect(url) as short, AcpClient.connect(url) as long:
                await short.initialize()
                await long.initialize()
                quick = await _turn_running(short, await short.new_session(), 1)
                slow = await _turn_running(long, await long.new_session(), 60)
                router.process.send_signal(signal.SIGTERM)
                await router.wait_for_log("draining for 3.0 s")
                assert (await quick).get("result") == {"stopReason": "end_turn"}
                cut = await slow
                assert cut["error"]["data"]["reason"] == "the router is stopping", cut
                await asyncio.gather(closed_at(short), closed_at(long))
            assert await router.stop() == 0


# -- answers that come after the stop closed their connection -------------------------------------

#: frames the client queues on a link the relay holds: more than the sockets between hold
#: (a few MiB), each under the scripted backend's frame limit (1 MiB), so the stop waits for
#: the link to flush (up to its deadline) after it has answered everything in flight
PADS, PAD_CHARS = 12, 800_000
IN_FLIGHT = 3


@dataclass
class Scene:
    """A client with a prompt turn on ``turns`` (behind ``relay``, which holds what the
    client sends it) and, on ``pool``, statuses, lists and locates whose probes and pages
    are held until ``answers`` is set."""

    turns: ScriptedBackend
    pool: ScriptedBackend
    relay: Relay
    answers: asyncio.Event
    turn_ends: asyncio.Event

    @property
    def backends(self) -> list[tuple[str, str]]:
        return [("turns", self.relay.url), ("pool", self.pool.url)]

    def release(self) -> None:
        self.answers.set()
        self.turn_ends.set()


@contextlib.asynccontextmanager
async def stop_scene() -> AsyncIterator[Scene]:
    answers = asyncio.Event()

    async def held(session_id: str) -> dict[str, Any] | None:
        if session_id == "s1":
            return {"status": "not_found"}  # s1 lives on the backend that cannot be asked
        await answers.wait()
        return {"status": "inactive"}

    async with (
        start_scripted("turns", _nothing, advertise_status=False) as turns,
        start_scripted("pool", held) as pool,
        start_relay(turns.url) as relay,
    ):
        turns.advertise_list = False
        turns.held["session/prompt"] = turn_ends = asyncio.Event()
        pool.held["session/list"] = answers
        scene = Scene(turns, pool, relay, answers, turn_ends)
        try:
            yield scene
        finally:
            scene.release()
            relay.release()


async def _nothing(session_id: str) -> dict[str, Any] | None:
    return None


def _asked(backend: ScriptedBackend, method: str) -> int:
    return sum(1 for m in backend.received if m.get("method") == method)


async def in_flight(client: AcpClient, scene: Scene) -> list[asyncio.Task[JsonObject]]:
    """A turn, then statuses, lists and locates, all waiting (the pads queued behind the
    turn on a link the relay holds); the requests, to be answered."""
    await client.initialize()
    resumed = await client.request("session/resume", {"sessionId": "s1", "cwd": "/w"})
    assert resumed.get("result") == {}, resumed
    requests = [asyncio.create_task(client.prompt("s1", "hello"))]
    for n in range(IN_FLIGHT):
        requests.append(asyncio.create_task(client.status(f"sess_status_{n}")))
        requests.append(asyncio.create_task(client.request("session/list", {})))
        params = {"sessionId": f"sess_locate_{n}", "cwd": "/w"}
        requests.append(asyncio.create_task(client.request("session/resume", params)))
    pool, turns = scene.pool, scene.turns
    async with asyncio.timeout(WAIT):
        await turns.until(lambda: _asked(turns, "session/prompt") == 1)
        # s1's, then one probe per status and per locate, a probe and a page per list
        await pool.until(
            lambda: (
                _asked(pool, "session/status") == 1 + 3 * IN_FLIGHT
                and _asked(pool, "session/list") == IN_FLIGHT
            )
        )
    scene.relay.hold()
    for _ in range(PADS):
        await client.notify("_test/pad", {"pad": "x" * PAD_CHARS})
    # answered by the router once it has read (and queued) every pad
    ping = await client.request("_test/ping", request_id="acp-router:ping")
    assert ping["error"]["code"] == -32600, ping
    return requests


async def stopped_answers(requests: list[asyncio.Task[JsonObject]]) -> None:
    """Every request in flight is answered -32013 by the stop."""
    for answer in await asyncio.gather(*requests):
        assert answer["error"]["code"] == -32013, answer


async def test_answers_that_come_after_a_stop_are_dropped_and_counted() -> None:
    probe = {"timeout_ms": 60_000, "list_timeout_ms": 60_000}  # nothing in flight times out
    async with stop_scene() as scene, start_router(scene.backends, probe=probe) as router:
        async with AcpClient.connect(router.url) as client:
            requests = await in_flight(client, scene)
            hurry = asyncio.Event()
            await drain(router.app, 0.0, hurry)
            clients: OpenClients = router.app[CLIENTS]  # the stop's own sequence (serve)
            stopping = asyncio.create_task(close_spread(list(clients), 0.0, hurry))
            await stopped_answers(requests)  # the connection is abandoned
            scene.release()  # now the pool answers, and the turn ends
            await stopping
        for kind, count in {"status": 3, "list": 3, "locate": 3, "backend": 1}.items():
            # on the code before: no such metric (each was dropped, uncounted)
            assert router.metric("acp_router_late_answers_total", kind=kind) == count, kind


async def test_a_stop_with_statuses_lists_and_locates_in_flight_logs_no_traceback(
    tmp_path: Path,
) -> None:
    async with stop_scene() as scene:
        config = tmp_path / "router.toml"
        tables = "".join(f'[[backends]]\nid = "{b}"\nurl = "{u}"\n' for b, u in scene.backends)
        probe = "[probe]\ntimeout_ms = 60000\nlist_timeout_ms = 60000\n"
        config.write_text(f'[router]\nlisten = "127.0.0.1:0"\n{probe}{tables}')
        async with run_cli("--log-level", "DEBUG", "serve", "--config", str(config)) as router:
            for backend, _ in scene.backends:
                await router.wait_for_log(f"backend {backend} is up")
            async with AcpClient.connect(router_url(router)) as client:
                requests = await in_flight(client, scene)
                router.process.send_signal(signal.SIGTERM)
                await stopped_answers(requests)
                scene.release()
                async with asyncio.timeout(WAIT):
                    assert await router.process.wait() == 0
            assert await router.stop() == 0  # its logs read to their end
        log = router.stderr.text
        assert "Traceback" not in log, log
        for kind in ("status", "list", "locate", "backend"):
            assert f"dropped a {kind} answer that came after the connection was closed" in log
