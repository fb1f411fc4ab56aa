"""``router.workers = N``: N worker processes behind one port, as real processes.

``acp-router serve`` with two workers answers clients on both (each worker counts its
own accepted connections in ``/metrics``, under its ``worker`` label), a scrape of
either shows every worker's series, SIGTERM stops both (exit 0, clients closed with
1012), SIGHUP reloads both, a killed worker is started again, and workers whose
parent is gone stop. The parent's supervision runs in-process against real child
processes that play workers, for the cases a real router does not show on demand.
tests/server/test_workers.py holds the parts that need no process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from router.server.process.shutdown import StopSignals
from router.server.process.supervisor import Supervisor, backoff, ended
from router.server.process.workers import (
    Listeners,
    reuse_port_balances,
)
from tests.e2e.support import HttpClient, router_url, rpc, write_config
from tests.fleet import start_fleet, start_scripted
from tests.raw_http import post_body, raw_post
from tests.server.support import CLIENTS, Samples, samples, value
from tests.support import WAIT, AcpClient, AgentProcess, CliProcess, run_cli, run_cli_to_exit

SERVICE_RESTART = 1012


def base_of(url: str) -> str:
    return url.removesuffix("/acp").replace("ws://", "http://")


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
        async with http.get(url) as response:
            assert response.status == 200
            return await response.text()


async def worker_pids(router: CliProcess, count: int) -> dict[int, int]:
    """Each worker's pid, from the parent's "worker I (pid P) started" lines."""
    pids = {}
    for index in range(count):
        line = await router.wait_for_log(f"worker {index} (pid ")
        match = re.search(rf"worker {index} \(pid (\d+)\) started", line)
        assert match, line
        pids[index] = int(match.group(1))
    return pids


async def wait_up_in_each_worker(router: CliProcess, agents: list[AgentProcess]) -> None:
    for index in range(2):
        for agent in agents:
            await router.wait_for_log(
                f"worker {index} router.server.links.control: backend {agent.agent_id} is up"
            )


@contextlib.asynccontextmanager
async def two_workers(
    tmp_path: Path, agents: list[AgentProcess], extra: str = ""
) -> AsyncIterator[CliProcess]:
    config = write_config(
        tmp_path / "router.toml", agents, f'listen = "127.0.0.1:0"\nworkers = 2\n{extra}'
    )
    async with run_cli("serve", "--config", str(config)) as router:
        await wait_up_in_each_worker(router, agents)
        yield router


async def clients_on_both_workers(
    stack: contextlib.AsyncExitStack, url: str
) -> tuple[list[AcpClient], Samples]:
    """``CLIENTS`` initialized clients, and the scrape that shows both workers took some."""
    clients = []
    for _ in range(CLIENTS):
        client = await stack.enter_async_context(AcpClient.connect(url))
        await client.initialize()
        clients.append(client)
    found = samples(await scrape(f"{base_of(url)}/metrics"))
    accepted = {
        worker: value(found, "acp_router_connections_total", result="accepted", worker=worker)
        for worker in ("0", "1")
    }
    assert accepted["0"], accepted
    assert accepted["1"], accepted
    assert accepted["0"] + accepted["1"] == CLIENTS, accepted
    return clients, found


async def closed_with(client: AcpClient) -> int | None:
    async with asyncio.timeout(WAIT):
        await client.ws.wait_closed()
    return client.ws.close_code


async def exited(pid: int) -> None:
    """Wait for process ``pid`` (not necessarily a child of ours) to exit: a pidfd turns
    readable then."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    try:
        async with asyncio.timeout(WAIT):
            await readable.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


# -- a real router with two workers -------------------------------------------------------------


async def test_two_workers_answer_clients_and_one_scrape_shows_both(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents) as router,
    ):
        url = router_url(router)
        async with contextlib.AsyncExitStack() as stack:
            clients, found = await clients_on_both_workers(stack, url)
            for client in clients[:4]:  # served end to end, whichever worker holds it
                session_id = await client.new_session()
                answer = await client.prompt(session_id, "hello")
                assert answer.get("result") == {"stopReason": "end_turn"}, answer
        for worker in ("0", "1"):
            assert value(found, "acp_router_worker_up", worker=worker) == 1.0
            assert value(found, "acp_router_backend_up", backend="agent-1", worker=worker) == 1.0
            assert value(found, "process_resident_memory_bytes", worker=worker)
        exposition = await scrape(f"{base_of(url)}/metrics")
        # one family each, every sample labelled with its worker
        helps = re.findall(r"^# HELP (\S+)", exposition, flags=re.MULTILINE)
        assert len(helps) == len(set(helps))
        assert all('worker="' in line for line in exposition.splitlines() if line[:1] != "#")
        async with aiohttp.ClientSession() as http:
            for _ in range(4):  # either worker may answer
                async with http.get(f"{base_of(url)}/readyz") as ready:
                    assert ready.status == 200
                    assert await ready.text() == "ready: 1 backend(s) up\n"
                async with http.get(f"{base_of(url)}/healthz") as health:
                    assert health.status == 200
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_sigterm_stops_every_worker_cleanly(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents) as router,
    ):
        pids = await worker_pids(router, 2)
        async with contextlib.AsyncExitStack() as stack:
            clients, _ = await clients_on_both_workers(stack, router_url(router))
            router.process.send_signal(signal.SIGTERM)
            codes = await asyncio.gather(*(closed_with(client) for client in clients))
            assert set(codes) == {SERVICE_RESTART}
            async with asyncio.timeout(WAIT):
                assert await router.process.wait() == 0
        for index in range(2):
            await router.wait_for_log(f"worker {index} router.server.process.shutdown: stopping")
            await router.wait_for_log(f"worker {index} router.server.process.serving: stopped")
        await asyncio.gather(*(exited(pid) for pid in pids.values()))
        assert await router.stop() == 0  # the logs read to their end
    assert router.stderr.lines[-1].rstrip().endswith("router.server.process.supervisor: stopped")
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_sighup_reloads_every_worker(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        first, second = agents
        async with two_workers(tmp_path, [first]) as router:
            write_config(tmp_path / "router.toml", agents, 'listen = "127.0.0.1:0"\nworkers = 2')
            router.process.send_signal(signal.SIGHUP)
            for index in range(2):
                line = await router.wait_for_log(
                    f"worker {index} router.server.operator.reload: config"
                )
                assert "added agent-2" in line, line
            await wait_up_in_each_worker(router, [second])
            found = samples(await scrape(f"{base_of(router_url(router))}/metrics"))
            for worker in ("0", "1"):
                assert value(found, "acp_router_backend_up", backend="agent-2", worker=worker) == 1
                ok = value(found, "acp_router_config_reloads_total", result="ok", worker=worker)
                assert ok == 1.0
            assert await router.stop() == 0


async def test_a_killed_worker_is_started_again(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents) as router,
    ):
        pids = await worker_pids(router, 2)
        os.kill(pids[1], signal.SIGKILL)
        killed = f"worker 1 (pid {pids[1]}) was killed by SIGKILL; starting it again in 0.5 s"
        await router.wait_for_log(killed)
        start = next(i for i, line in enumerate(router.stderr.lines) if killed in line)
        again = await router.wait_for_log("is listening again", start=start)
        assert re.search(r"worker 1 \(pid \d+\) is listening again", again), again
        up = "worker 1 router.server.links.control: backend agent-1 is up"
        await router.wait_for_log(up, start=start)
        url = router_url(router)
        async with contextlib.AsyncExitStack() as stack:
            _, found = await clients_on_both_workers(stack, url)
        assert value(found, "acp_router_worker_up", worker="1") == 1.0
        assert await router.stop() == 0


async def test_a_worker_started_again_takes_no_connection_before_its_backends_are_up(
    tmp_path: Path,
) -> None:
    async def inactive(session_id: str) -> dict[str, Any]:
        return {"status": "inactive"}

    created = '{"jsonrpc":"2.0","id":$ID,"result":{"sessionId":"sess_1"}}'
    async with start_scripted("slow", inactive) as backend:
        backend.scripted = {"session/new": [created]}
        backend.control_initialize_seconds = 1.0  # up a second after each worker starts
        config = tmp_path / "router.toml"
        config.write_text(
            f'[router]\nlisten = "127.0.0.1:0"\nworkers = 2\n'
            f'[[backends]]\nid = "slow"\nurl = "{backend.url}"\n'
        )
        async with run_cli("serve", "--config", str(config)) as router:
            url = router_url(router)
            pids = await worker_pids(router, 2)
            os.kill(pids[1], signal.SIGKILL)
            killed = await router.wait_for_log(f"worker 1 (pid {pids[1]}) was killed")
            start = router.stderr.lines.index(killed)
            await router.wait_for_log(") started", start=start)
            listening = asyncio.create_task(router.wait_for_log("listening again", start=start))
            # new clients from the moment worker 1 starts again until it has taken some:
            # none is told no backend is available (on the old main, those that reached
            # it in its first second got -32011)
            answers, after = [], 0
            while after < CLIENTS:
                async with AcpClient.connect(url) as client:
                    await client.initialize()
                    answers.append(
                        await client.request("session/new", {"cwd": "/w", "mcpServers": []})
                    )
                after += listening.done()
            assert [a for a in answers if "error" in a] == []
            found = samples(await scrape(f"{base_of(url)}/metrics"))
            accepted = value(found, "acp_router_connections_total", result="accepted", worker="1")
            assert accepted, found  # worker 1 took some, once up
            assert await router.stop() == 0
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_workers_stop_when_their_parent_is_gone(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents) as router,
    ):
        pids = await worker_pids(router, 2)
        folder = worker_folder(pids[0])
        assert sorted(p.name for p in folder.iterdir()) == ["worker-0.sock", "worker-1.sock"]
        router.process.kill()
        for index in range(2):
            await router.wait_for_log(
                f"worker {index} router.server.process.workers: the parent process is gone"
            )
        await asyncio.gather(*(exited(pid) for pid in pids.values()))
    assert "Traceback" not in router.stderr.text, router.stderr.text
    # the killed parent could not remove its folder: the last worker out did
    assert not folder.exists(), sorted(folder.iterdir())


def worker_folder(pid: int) -> Path:
    """The parent's private folder, from worker ``pid``'s command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return Path(argv[argv.index("--worker-folder") + 1])


def rss(pid: int) -> int:
    """Process ``pid``'s resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def peak_rss(pid: int) -> int:
    """Process ``pid``'s highest resident memory since its peak was last reset, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def reset_peak(pid: int) -> None:
    """Start process ``pid``'s high-water mark (``VmHWM``) over from its memory now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class PeakMemory:
    """The highest resident memory each of some processes reached while it ran, above
    where it started: the kernel's high-water mark, reset when the watch begins
    (``/proc/PID/clear_refs``), so nothing samples and no peak between samples is missed."""

    def __init__(self, pids: list[int]) -> None:
        self.start = {pid: rss(pid) for pid in pids}
        self.peak = dict(self.start)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        for pid in self.peak:
            reset_peak(pid)
            self.start[pid] = rss(pid)
        try:
            yield
        finally:
            for pid in self.peak:
                self.peak[pid] = max(self.start[pid], peak_rss(pid))

    def grown(self) -> list[int]:
        return [self.peak[pid] - self.start[pid] for pid in self.peak]


async def test_workers_read_no_body_before_the_token_and_hold_bodies_within_budget(
    tmp_path: Path,
) -> None:
    most = 16 * 1024 * 1024
    budget = 3 * most
    extra = (
        f"max_message_bytes = {most}\nmax_held_bytes = {budget}\nhandshake_timeout_ms = 30000"
        '\n[auth]\ntokens = ["tok-good"]'
    )
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents, extra) as router,
    ):
        url = f"{base_of(router_url(router))}/acp"
        pids = list((await worker_pids(router, 2)).values())
        # 16 bodies of 16 MiB, no token, for connections of either worker: answered 401
        # before they are read, by whichever worker the kernel hands them (on the old
        # main, a worker passing one on read it whole first: +134 and +215 MB)
        memory = PeakMemory(pids)
        async with memory.watching():
            answers = await asyncio.gather(
                *(post_body(url, raw_post(f"{n % 2}.x", most), most) for n in range(16))
            )
        assert {status for status, _ in answers} == {401}, answers
        assert max(memory.grown()) < 50 * 1024 * 1024, memory.grown()

        # 20 bodies with the token, held unfinished at once: each worker reads three
        # (its budget) and answers the rest 503 at once (on the old main: +424 MB)
        memory = PeakMemory(pids)
        async with memory.watching():
            posts = [
                asyncio.create_task(
                    post_body(url, raw_post(f"{n % 2}.x", most, "tok-good"), most, hold_last=True)
                )
                for n in range(20)
            ]
            try:
                refused: list[tuple[int, dict[str, str]]] = []
                for answer in asyncio.as_completed(posts):
                    refused.append(await answer)
                    if len(refused) == 20 - 2 * 3:
                        break
                assert {status for status, _ in refused} == {503}, refused
                assert all("retry-after" in headers for _, headers in refused)
                assert sum(not post.done() for post in posts) == 2 * 3  # held, being read
            finally:
                for post in posts:
                    post.cancel()
                await asyncio.gather(*posts, return_exceptions=True)
        assert max(memory.grown()) < budget + 16 * 1024 * 1024, memory.grown()
        # aiohttp goes on reading (and dropping) the rest of a refused body for up to
        # 10 s, even once its client is gone: the stop may wait that long
        assert await router.stop(timeout=3 * WAIT) == 0
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_streamable_http_connections_work_whichever_worker_a_request_reaches(
    tmp_path: Path,
) -> None:
    new_session = rpc(1, "session/new", {"cwd": "/work/project", "mcpServers": []})
    # a TCP connection per request, as a client with several in its pool: the kernel
    # hands each to either worker, so about half reach the one that does not hold it
    fresh = aiohttp.TCPConnector(force_close=True)
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents) as router,
        aiohttp.ClientSession(connector=fresh) as http,
    ):
        url = f"{base_of(router_url(router))}/acp"
        clients = [HttpClient(http, url) for _ in range(4)]
        for client in clients:
            await client.initialize()
            assert re.fullmatch(r"[01]\.[\w-]{32}", client.connection_id), client.connection_id
            async with client.stream() as connection_stream:
                assert await client.post(new_session) == 202
                session_id = (await connection_stream.message())["result"]["sessionId"]
                async with client.stream(session_id) as session_stream:
                    for request_id in (2, 3, 4):
                        prompt = rpc(request_id, "session/prompt", {"sessionId": session_id})
                        prompt["params"]["prompt"] = [{"type": "text", "text": "hi"}]
                        assert await client.post(prompt, session_id) == 202
                        said = await session_stream.message()
                        assert said["params"]["update"]["content"]["text"] == "[agent-1] hi"
                        assert (await session_stream.message())["id"] == request_id
                assert await client.delete() == 202
                await connection_stream.ended()
            assert await client.post(rpc(5, "session/list")) == 404  # gone, from either worker
        found = samples(await scrape(f"{base_of(router_url(router))}/metrics"))
        passed = [value(found, "acp_router_http_passed_on_total", worker=w) for w in "01"]
        assert sum(p or 0 for p in passed) > 0, passed
        posts = [
            value(found, "acp_router_http_requests_total", method="POST", status="202", worker=w)
            for w in "01"
        ]
        assert sum(p or 0 for p in posts) == 4 * 4  # counted once, by the worker holding each
        for stranger in ("0.nope", "1.nope", "7.nope", "nope"):
            client = HttpClient(http, url)
            client.connection_id = stranger
            assert await client.post(rpc(1, "session/list")) == 404
        assert await router.stop() == 0
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_workers_serve_tls_on_the_sockets_they_are_given(tmp_path: Path) -> None:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    extra = f'tls_cert = "{cert}"\ntls_key = "{key}"'
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents, extra) as router,
    ):
        url = router_url(router)
        assert url.startswith("wss://127.0.0.1:"), url
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(CLIENTS // 2):
                client = await stack.enter_async_context(AcpClient.connect(url, tls=trusting))
                assert "result" in await client.initialize()
        assert await router.stop() == 0


async def test_metrics_listen_is_served_by_the_parent_for_every_worker(tmp_path: Path) -> None:
    extra = 'metrics_listen = "127.0.0.1:0"'
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        two_workers(tmp_path, agents, extra) as router,
    ):
        line = await router.wait_for_log("metrics of every worker on http://")
        found = samples(await scrape(line.split(" on ")[-1].strip()))
        for worker in ("0", "1"):
            assert value(found, "acp_router_backend_up", backend="agent-1", worker=worker) == 1.0
            assert value(found, "acp_router_worker_up", worker=worker) == 1.0
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base_of(router_url(router))}/metrics") as front_door:
                assert front_door.status == 404
        assert await router.stop() == 0


async def test_one_worker_is_the_router_alone(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", agents)
        async with run_cli("serve", "--config", str(config)) as router:
            await router.wait_for_log("backend agent-1 is up")
            pid = router.process.pid
            children = await asyncio.to_thread(Path(f"/proc/{pid}/task/{pid}/children").read_text)
            assert children == ""
            exposition = await scrape(f"{base_of(router_url(router))}/metrics")
            assert 'worker="' not in exposition
            assert 'acp_router_backend_up{backend="agent-1"} 1.0' in exposition
            assert await router.stop() == 0
        assert " worker " not in router.stderr.text


async def test_workers_must_be_a_positive_number(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text(
        '[router]\nworkers = 0\n[[backends]]\nid = "a"\nurl = "ws://127.0.0.1:1/acp"\n'
    )
    run = await run_cli_to_exit("serve", "--config", str(config))
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"acp-router: {config}: router: 'workers' must be greater than 0, not 0"
    )


async def test_the_worker_options_are_the_parents_to_give(tmp_path: Path) -> None:
    run = await run_cli_to_exit("serve", "--config", str(tmp_path / "r.toml"), "--worker", "0/2")
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "acp-router: --worker, --worker-folder and --worker-fds go together; the parent"
        " of a router with workers gives them to its worker processes"
    )
    assert "--worker" not in (await run_cli_to_exit("serve", "--help")).stdout


# -- the parent, with child processes that play workers ----------------------------------------

#: a worker as the parent sees one: ``python -c FAKE_WORKER MODE --worker I/N ...``,
#: ending with status 0 on SIGTERM once it listens.
#: serve: say listening, exit 0 on SIGTERM; fail-1: worker 1 exits 3 at once;
#: crash-once:FILE: the first start exits 3 after saying listening (and creates FILE),
#: later starts serve; crash:FILE: the same, but later starts exit 3 at once; held:DIR: record each SIGHUP in DIR/hangups, and say listening
#: only once DIR/go-INDEX (a FIFO) has been written and closed
FAKE_WORKER = """
import os, pathlib, signal, sys
mode, _, path = sys.argv[1].partition(":")
args = sys.argv[2:]
index = int(args[args.index("--worker") + 1].partition("/")[0])
channel = int(args[args.index("--worker-fds") + 1].split(",")[-1])
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken below, by sigwait
if mode == "held":
    signal.signal(signal.SIGHUP, lambda *_: open(f"{path}/hangups", "a").write(f"{index}\\n"))
    open(f"{path}/go-{index}").read()
if mode == "fail-1" and index == 1:
    sys.exit(3)
if mode in ("crash-once", "crash") and not os.path.exists(path):
    open(path, "w").close()
    os.write(channel, b"listening\\n")
    sys.exit(3)
if mode == "crash":
    sys.exit(3)
os.write(channel, b"listening\\n")
signal.sigwait({signal.SIGTERM})  # a SIGHUP before it is handled once this returns
"""


class Records(logging.Handler):
    """The supervisor's log messages, to wait on."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.changed.set()

    async def wait_for(self, text: str) -> str:
        async with asyncio.timeout(WAIT):
            while not any(text in message for message in self.messages):
                self.changed.clear()
                await self.changed.wait()
        return next(message for message in self.messages if text in message)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    supervisor_log = logging.getLogger("router.server.process.supervisor")
    supervisor_log.addHandler(handler)
    level = supervisor_log.level
    supervisor_log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        supervisor_log.removeHandler(handler)
        supervisor_log.setLevel(level)


@contextlib.asynccontextmanager
async def supervising(
    tmp_path: Path, mode: str, count: int
) -> AsyncIterator[tuple[Supervisor, StopSignals, asyncio.Task[int], asyncio.Event]]:
    """A supervisor of ``count`` fake workers in ``mode``, running; its run's task and
    the event its announcement sets."""
    listeners = Listeners("127.0.0.1", 0, balanced=reuse_port_balances())
    command = [sys.executable, "-c", FAKE_WORKER, mode]
    supervisor = Supervisor(command, count, tmp_path, listeners)
    signals = StopSignals()
    announced = asyncio.Event()
    run = asyncio.create_task(supervisor.run(signals, announced.set))
    try:
        yield supervisor, signals, run, announced
    finally:
        signals.stop.set()
        async with asyncio.timeout(WAIT):
            await asyncio.gather(run, return_exceptions=True)
        listeners.close()


async def test_a_worker_that_fails_at_the_start_stops_the_router(
    tmp_path: Path, records: Records
) -> None:
    async with supervising(tmp_path, "fail-1", 2) as (_, _, run, announced):
        async with asyncio.timeout(WAIT):
            assert await run == 1
    line = await records.wait_for("before the router was listening: stopping")
    assert re.fullmatch(r"worker 1 \(pid \d+\) exited with status 3 before the router.*", line)
    assert not announced.is_set()


async def test_a_worker_that_ends_starts_again_after_a_backoff(
    tmp_path: Path, records: Records
) -> None:
    marker = tmp_path / "crashed"
    async with supervising(tmp_path, f"crash-once:{marker}", 1) as (_, signals, run, announced):
        line = await records.wait_for("exited with status 3; starting it again in 0.5 s")
        assert line.startswith("worker 0 (pid ")
        await records.wait_for("is listening again")
        assert announced.is_set()
        signals.stop.set()
        async with asyncio.timeout(WAIT):
            assert await run == 0


async def test_the_backoff_grows_while_a_worker_keeps_ending_and_a_stop_cuts_it_short(
    tmp_path: Path, records: Records
) -> None:
    marker = tmp_path / "crashed"
    async with supervising(tmp_path, f"crash:{marker}", 1) as (_, signals, run, announced):
        await records.wait_for("exited with status 3; starting it again in 0.5 s")
        await records.wait_for("exited with status 3; starting it again in 1.0 s")
        await records.wait_for("exited with status 3; starting it again in 2.0 s")
        assert announced.is_set()
        signals.stop.set()  # while it waits 2 s to start the worker again
        async with asyncio.timeout(1.0):
            assert await run == 0


async def test_sighup_reaches_every_worker_once_it_listens(
    tmp_path: Path, records: Records
) -> None:
    for index in range(2):
        os.mkfifo(tmp_path / f"go-{index}")
    async with supervising(tmp_path, f"held:{tmp_path}", 2) as (supervisor, signals, run, ready):
        for index in range(2):
            await records.wait_for(f"worker {index} (pid ")  # started, not listening yet
        supervisor.reload()  # held for each worker until it listens
        for index in range(2):
            await asyncio.to_thread((tmp_path / f"go-{index}").write_text, "go")
        async with asyncio.timeout(WAIT):
            await ready.wait()
        signals.stop.set()
        async with asyncio.timeout(WAIT):
            assert await run == 0
    # SIGHUP is handled before the SIGTERM that came after it
    assert sorted((tmp_path / "hangups").read_text().split()) == ["0", "1"]


def test_backoff_doubles_up_to_its_bound() -> None:
    assert [backoff(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff(60) == 30.0
    assert ended(-signal.SIGKILL) == "was killed by SIGKILL"
    assert ended(3) == "exited with status 3"
