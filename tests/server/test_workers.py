"""The parts of ``router.workers = N`` in one process, on real sockets: merged scrapes,
the affinity in front of a worker's front door (a request for another worker passed on
within the door and the budget), and the sockets the workers are given
(tests/e2e/test_workers.py: N worker processes behind one port)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, strategies as st

from router.server.door.app_keys import DOOR, HTTP_FRONT, METRICS, TOKENS
from router.server.observability.metrics import Metrics, WorkersExposition, merge
from router.server.process.app import create_app
from router.server.process.workers import (
    Affinity,
    Listeners,
    WorkerRole,
    reuse_port_balances,
    sibling_socket,
    worker_of,
)
from tests.core.support import IDS
from tests.fleet import router_settings
from tests.raw_http import raw_connection, raw_post, status_of
from tests.server.support import CLIENTS, samples, value
from tests.support import WAIT


def test_a_scrape_merges_the_workers_registries() -> None:
    first, second = Metrics(), Metrics()
    first.connections.labels("accepted").inc()
    second.connections.labels("accepted").inc(2)
    second.locate_duration.labels("active").observe(0.001)
    merged = merge({0: first.exposition(), 1: second.exposition(), 2: None}).decode()
    found = samples(merged)
    assert value(found, "acp_router_connections_total", result="accepted", worker="0") == 1
    assert value(found, "acp_router_connections_total", result="accepted", worker="1") == 2
    assert value(found, "acp_router_locate_duration_seconds_count", outcome="active", worker="1")
    assert [value(found, "acp_router_worker_up", worker=w) for w in "012"] == [1.0, 1.0, 0.0]
    helps = re.findall(r"^# HELP (\S+)", merged, flags=re.MULTILINE)
    assert len(helps) == len(set(helps))
    assert "acp_router_connections_total" in helps


async def test_a_scrape_says_which_workers_did_not_answer(tmp_path: Path) -> None:
    metrics = Metrics()
    nobody = [tmp_path / "worker-0.sock", tmp_path / "worker-1.sock"]  # no one serves these
    found = samples((await WorkersExposition(nobody, own=(0, metrics))()).decode())
    assert value(found, "acp_router_worker_up", worker="0") == 1.0
    assert value(found, "acp_router_worker_up", worker="1") == 0.0
    assert value(found, "acp_router_max_connections", worker="0") == 0.0
    assert value(found, "acp_router_max_connections", worker="1") is None


@contextlib.asynccontextmanager
async def front_door_of_worker(tmp_path: Path, index: int, **router: Any) -> AsyncIterator[str]:
    """A front door of worker ``index`` of two with :class:`Affinity` in front of a
    handler that answers like the HTTP front: a new connection id for a request without
    one, and the id it was asked about otherwise. No other worker runs, unless the test
    serves one on its socket. ``router``: settings of the ``[router]`` and ``[auth]``
    tables (the door and the limits a request passed on meets)."""

    async def handler(request: web.Request) -> web.Response:
        asked = request.headers.get("Acp-Connection-Id")
        return web.Response(text=asked or "", headers={"Acp-Connection-Id": asked or "fresh"})

    role = WorkerRole(index, 2, tmp_path, (0,), 0)
    tables = {"router": router} | ({"auth": router.pop("auth")} if "auth" in router else {})
    settings = router_settings([("a", "ws://127.0.0.1:9/acp")], **tables)
    router_app = create_app(settings)
    async with Affinity(role, router_app[HTTP_FRONT]) as affinity:
        app = web.Application(middlewares=[affinity.middleware])
        app[DOOR], app[TOKENS] = router_app[DOOR], router_app[TOKENS]  # what the door reads
        app[METRICS] = router_app[METRICS]
        app.router.add_route("*", "/acp", handler)
        # aiohttp reads and drops the rest of a body it answered unread for up to
        # lingering_time, even once the client is gone; the clean-up waits for it
        runner = web.AppRunner(app, handle_signals=False, access_log=None, lingering_time=0.5)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            yield f"http://127.0.0.1:{runner.addresses[0][1]}/acp"
        finally:
            await runner.cleanup()


@given(IDS, st.integers(1, 256))
def test_a_connection_id_names_a_worker_or_nothing(tagged: str, count: int) -> None:
    tag = worker_of(tagged, count)
    if tag is not None:
        index, bare = tag
        assert 0 <= index < count
        assert tagged == f"{index}.{bare}"


def test_a_connection_id_with_leading_zeros_names_no_worker() -> None:
    """Found by the property above: ``00.x`` reached worker 0 as ``x``, an alias of ``0.x``."""
    assert worker_of("0.x", 10) == (0, "x")
    assert worker_of("00.x", 10) is None
    assert worker_of("07.x", 10) is None


async def test_affinity_tags_new_connections_and_strips_its_own_tag(tmp_path: Path) -> None:
    async with front_door_of_worker(tmp_path, 0) as url, aiohttp.ClientSession() as http:
        async with http.post(url) as new:
            assert new.headers["Acp-Connection-Id"] == "0.fresh"
        async with http.post(url, headers={"Acp-Connection-Id": "0.abc"}) as own:
            assert await own.text() == "abc"  # the front door sees its bare id
        async with http.post(url, headers={"Acp-Connection-Id": "abc"}) as untagged:
            assert await untagged.text() == "abc"  # not a worker's: the front door says 404
        # worker 1 is not there (between its death and its new start): its connections
        # went with it
        async with http.post(url, headers={"Acp-Connection-Id": "1.abc"}) as gone:
            assert gone.status == 404
            assert await gone.text() == "no such connection\n"


async def test_affinity_reads_only_ascii_digits_as_a_worker(tmp_path: Path) -> None:
    async with front_door_of_worker(tmp_path, 0) as url:
        host, port = url.removeprefix("http://").removesuffix("/acp").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            # "\u00b2" (superscript two) is a digit to str.isdigit, and not to int()
            request = "POST /acp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
            writer.write(request.encode() + "Acp-Connection-Id: \u00b2.abc\r\n\r\n".encode())
            async with asyncio.timeout(WAIT):
                status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status  # not a worker's: passed through
        finally:
            writer.close()


async def test_affinity_reads_a_worker_index_of_any_length_without_failing(
    tmp_path: Path,
) -> None:
    async with front_door_of_worker(tmp_path, 0) as url, aiohttp.ClientSession() as http:
        # int() refuses more than 4,300 digits: on the old main, a 500 and a traceback
        for tagged in ("1" * 4301 + ".x", "0" * 5000 + "1.x", "00.x"):
            async with http.post(url, headers={"Acp-Connection-Id": tagged}) as answer:
                assert answer.status == 200, tagged  # not a worker's: passed through
                assert await answer.text() == tagged


async def test_a_request_for_another_worker_meets_the_token_before_its_body_is_read(
    tmp_path: Path,
) -> None:
    auth = {"tokens": ["tok-good"]}
    async with front_door_of_worker(tmp_path, 0, auth=auth) as url:
        async with raw_connection(url) as (reader, writer):
            # 16 MiB announced, none of it sent: on the old main the body was awaited
            # (then 408), the token checked only once it had all arrived
            writer.write(raw_post("1.abc", 16 * 1024 * 1024))
            status, headers = await status_of(reader)
            assert status == 401
            assert headers["www-authenticate"] == "Bearer"


async def test_bodies_passed_on_are_held_within_max_held_bytes(tmp_path: Path) -> None:
    most = 1024 * 1024
    async with (
        front_door_of_worker(tmp_path, 0, max_message_bytes=most, max_held_bytes=most) as url,
        raw_connection(url) as (first, first_writer),
        raw_connection(url) as (second, second_writer),
    ):
        for writer in (first_writer, second_writer):  # both being read, neither whole
            writer.write(raw_post("1.abc", most) + b"{" * 1000)
        # one body fits: the other is refused before it is read
        answers = [asyncio.create_task(status_of(reader)) for reader in (first, second)]
        done, pending = await asyncio.wait(answers, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        status, headers = done.pop().result()
        assert status == 503
        assert headers["retry-after"] == "1"


@contextlib.asynccontextmanager
async def endless_sibling(tmp_path: Path, index: int) -> AsyncIterator[asyncio.Event]:
    """Worker ``index``'s socket, serving an event stream that never ends on ``GET
    /acp``: it writes until a write fails, then sets the event yielded."""
    ended = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b": " + b"x" * 65536 + b"\n\n")
        except ConnectionError:
            ended.set()
        return response

    app = web.Application()
    app.router.add_get("/acp", stream)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(sibling_socket(tmp_path, index))).start()
        yield ended
    finally:
        await runner.cleanup()


async def test_an_event_stream_passed_on_and_never_read_is_dropped(tmp_path: Path) -> None:
    async with (
        front_door_of_worker(tmp_path, 0, http_keepalive_seconds=0.25) as url,
        endless_sibling(tmp_path, 1) as ended,
    ):
        host, port = url.removeprefix("http://").removesuffix("/acp").split(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            get = "GET /acp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
            sock.sendall(f"{get}Acp-Connection-Id: 1.abc\r\n\r\n".encode())
            # the client reads nothing: the write to it waits past a local stream's
            # deadline (2 x http_keepalive_seconds), and the stream is dropped (on the old
            # main the write waited for ever, the owner's stream with it)
            async with asyncio.timeout(WAIT):
                await ended.wait()


def _accepts(listening: list[socket.socket]) -> list[int]:
    """How many pending connections each socket holds (accepting them all)."""
    counts = []
    for sock in listening:
        sock.setblocking(False)
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                sock.accept()[0].close()
                count += 1
        counts.append(count)
    return counts


@pytest.mark.skipif(not reuse_port_balances(), reason="SO_REUSEPORT balances on Linux only")
def test_each_worker_gets_its_own_socket_on_one_reserved_port() -> None:
    listeners = Listeners("127.0.0.1", 0, balanced=True)
    try:
        first, second = listeners.for_worker(), listeners.for_worker()
        assert {s.getsockname()[1] for s in first + second} == {listeners.port}
        with socket.socket() as outsider, pytest.raises(OSError, match="in use"):
            outsider.bind(("127.0.0.1", listeners.port))  # reserved, even between workers
        # a worker's socket takes no connection until the worker makes it listen (ready)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", listeners.port)).close()
        for sock in first + second:
            sock.listen()
        clients = [socket.create_connection(("127.0.0.1", listeners.port)) for _ in range(CLIENTS)]
        counts = _accepts(first + second)
        assert all(counts), counts
        assert sum(counts) == CLIENTS, counts
        for sock in second:  # a worker that ends takes its socket along: the rest take all
            sock.close()
        clients += [socket.create_connection(("127.0.0.1", listeners.port)) for _ in range(8)]
        assert _accepts(first) == [8]
        for sock in [*first, *clients]:
            sock.close()
    finally:
        listeners.close()


def test_every_address_of_the_name_gets_the_one_port() -> None:
    listeners = Listeners("localhost", 0, balanced=reuse_port_balances())
    try:
        sockets = listeners.for_worker()
        assert sockets
        assert {sock.getsockname()[1] for sock in sockets} == {listeners.port}
        listeners.handed_over(sockets)
    finally:
        listeners.close()


def test_without_balancing_every_worker_shares_one_socket() -> None:
    listeners = Listeners("127.0.0.1", 0, balanced=False)
    try:
        first, second = listeners.for_worker(), listeners.for_worker()
        assert first == second
        listeners.handed_over(first)  # the parent keeps them for the next worker
        with socket.create_connection(("127.0.0.1", listeners.port)):
            assert _accepts(first) == [1]
    finally:
        listeners.close()


def test_a_role_goes_through_the_command_line() -> None:
    role = WorkerRole(1, 3, Path("/run/x"), (7, 8), 9)
    argv = role.argv()
    assert argv == ["--worker", "1/3", "--worker-folder", "/run/x", "--worker-fds", "7,8,9"]
    assert WorkerRole.of(argv[1], argv[3], argv[5]) == role
    with pytest.raises(ValueError, match="not a worker role"):
        WorkerRole.of("3/3", "/run/x", "7,9")
