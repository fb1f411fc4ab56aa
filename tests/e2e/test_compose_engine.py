"""The compose demo on a real Docker engine (``make compose-test``): the shipped
docker-compose.yml brought up with each Compose installed, and driven as the README says.

The router and the three agents run in containers built from deploy/Dockerfile (on
``python:3.11-slim``, or on the local stand-in where it cannot be pulled: tests/engine.py).
An editor initializes, opens a session and prompts it, disconnects, and resumes it from a
new connection on the same agent; /healthz, /readyz and /metrics answer; then the agent
container holding the session crashes (its process killed, as an out-of-memory kill would),
the editor's next prompt and its resume from a new connection are served (failover), and
``restart: unless-stopped`` brings the container back into the pool; then that agent is
stopped by hand (which the restart policy respects), and the session is served by another
agent from the shared store, until the agent is started again and rejoins the pool.
It prints what it drove. Everything it started goes at the end, the store volume included.

It runs only when asked (``ACP_ROUTER_COMPOSE_TEST`` set, as ``make compose-test`` does):
``run`` skips where no engine can be had, saying why; ``require`` (``.ci/run``) fails
there instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.engine import (
    NoEngine,
    base_image,
    checked,
    composes,
    docker,
    docker_engine,
)
from tests.monitoring import is_backend_down, prometheus_config
from tests.prometheus_server import (
    PROMETHEUS,
    AlertReceiver,
    Prometheus,
    receive_alerts,
    run_prometheus,
)
from tests.support import (
    CWD,
    AcpClient,
    JsonObject,
    LogLines,
    chunk_texts,
    resume,
    run_to_exit,
    speaker,
)
from tests.topology import COMPOSE_FILE, agent_services

MODE = os.environ.get("ACP_ROUTER_COMPOSE_TEST", "")
#: one step of the demo in containers (a build is longer: its own bound)
STEP = 60.0
#: a prompt sent after the crash waits for its session's failover (control.down_grace_ms
#: at most, once the restarted container answers as a new process)
FAILOVER = 90.0
#: the JSON-RPC code of a request lost with its backend link (retryable: docs/routing.md)
LINK_LOST = -32013

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        MODE not in ("run", "require"),
        reason="the compose demo on a Docker engine runs under `make compose-test` (.ci/run runs it)",
    ),
]


def say(line: str) -> None:
    """What the test drove, for the one who runs ``make compose-test`` (pytest -s)."""
    print(f"compose-test: {line}", flush=True)  # noqa: T201


# -- the project in containers ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class Project:
    """One ``docker-compose -p NAME`` run of the shipped file (and the test's override)."""

    compose: Sequence[str]
    name: str
    files: tuple[Path, ...]
    env: dict[str, str]
    port: int
    router_log: LogLines

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def run(self, *args: str, timeout: float = STEP) -> str:
        argv = [*self.compose, "--project-name", self.name]
        for file in self.files:
            argv += ["--file", str(file)]
        done = await run_to_exit(*argv, *args, timeout=timeout, env={**os.environ, **self.env})
        return checked(done, f"{' '.join(argv[:2])} {' '.join(args)}")

    async def container(self, service: str) -> str:
        container = (await self.run("ps", "--quiet", service)).strip()
        assert container, f"no container for {service}"
        return container


def _override(image: str) -> str:
    """The test's override: its own image tag, so that runs side by side (and a user's own
    acp-router:0.1.0) do not replace each other's image."""
    services = ["router", *agent_services()]
    return yaml.safe_dump({"services": {name: {"image": image} for name in services}})


async def _follow(container: str, into: LogLines) -> None:
    """Copy a container's log (stdout and stderr) into ``into`` until it is removed."""
    process = await asyncio.create_subprocess_exec(
        "docker", "logs", "--follow", container,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        await into.drain(process.stdout)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


@contextlib.asynccontextmanager
async def compose_up(compose: Sequence[str], base: str, workdir: Path) -> AsyncIterator[Project]:
    """Build and start the router and the agents; yield once the router has every agent up
    and every container's healthcheck passed; take everything down, volumes included."""
    tag = secrets.token_hex(4)
    image = f"acp-router:compose-test-{tag}"
    override = workdir / "compose-test.override.yml"
    override.write_text(_override(image))
    env = {"PYTHON_IMAGE": base, "ACP_ROUTER_PORT": str(_free_port())}
    project = Project(
        compose, f"acp-router-test-{tag}", (COMPOSE_FILE, override), env,
        int(env["ACP_ROUTER_PORT"]), LogLines(),
    )  # fmt: skip
    services = ["router", *agent_services()]
    health = LogLines()
    events = await asyncio.create_subprocess_exec(
        "docker", "events", "--filter", "type=container", "--filter", "event=health_status",
        "--filter", f"label=com.docker.compose.project={project.name}",
        "--format", "{{index .Actor.Attributes \"com.docker.compose.service\"}} {{.Status}}",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert events.stdout is not None
    watching = asyncio.create_task(health.drain(events.stdout))
    follower: asyncio.Task[None] | None = None
    try:
        await project.run("build", timeout=600)
        await project.run("up", "--detach", "--no-build", "router")
        follower = asyncio.create_task(
            _follow(await project.container("router"), project.router_log)
        )
        for agent in agent_services():
            await project.router_log.wait_for(f"backend {agent} is up", STEP)
        for service in services:
            await health.wait_for(f"{service} health_status: healthy", STEP)
        say(f"{' '.join(compose)}: {', '.join(services)} up and healthy, on {base}")
        yield project
    finally:
        events.kill()
        await events.wait()
        await watching
        try:
            await project.run("down", "--volumes", "--remove-orphans", "--timeout", "5")
        finally:
            await docker("image", "rm", "--force", image)
            if follower is not None:
                await follower  # its container is gone: the log has ended


# -- the editor's side ------------------------------------------------------------------------


async def prompt_answered(client: AcpClient, session_id: str, timeout: float = STEP) -> str:
    """Prompt ``session_id``; the agent that answered. A request lost with its link (the
    retryable -32013) is sent again once, as an editor would."""
    for attempt in range(2):
        client.drain_incoming()
        response = await client.prompt(session_id, "hello", timeout=timeout)
        if response.get("error", {}).get("code") == LINK_LOST and attempt == 0:
            say(f"prompt answered {LINK_LOST} (its link was lost): sent again")
            continue
        assert response.get("result") == {"stopReason": "end_turn"}, response
        texts = chunk_texts(client.drain_incoming(), session_id)
        assert texts, "the prompt produced no chunk"
        return speaker(texts[0])
    raise AssertionError("unreachable")


async def _resume_and_prompt(url: str, session_id: str, timeout: float = STEP) -> str:
    """A new connection: initialize, resume ``session_id``, prompt it; who answered."""
    async with AcpClient.connect(url) as client:
        await client.initialize()
        answer: JsonObject = await resume(client, session_id)
        assert "result" in answer, answer
        return await prompt_answered(client, session_id, timeout)


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with asyncio.timeout(STEP), http.get(url) as response:
        return response.status, await response.text()


def _backend_up(metrics: str, backend: str) -> bool:
    return f'acp_router_backend_up{{backend="{backend}"}} 1.0' in metrics


async def _crash(project: Project, service: str) -> int:
    """SIGKILL the container's process from the host, as a crash (``docker kill`` is a stop
    by hand, which ``restart: unless-stopped`` leaves stopped); its restart count before."""
    container = await project.container(service)
    state = await docker("inspect", "--format", "{{.State.Pid}} {{.RestartCount}}", container)
    pid, restarts = (int(field) for field in checked(state, "docker inspect").split())
    assert pid > 1, f"{service} has no running process ({pid})"
    os.kill(pid, signal.SIGKILL)
    return restarts


# -- the test -------------------------------------------------------------------------------------


async def test_the_compose_demo_runs_on_a_docker_engine(tmp_path: Path) -> None:
    try:
        async with docker_engine() as engine:
            say(f"engine: {engine}")
            base = await base_image()
            found = await composes()
            assert found, "no Compose installed (Debian: apt-get install docker-compose)"
            for name in ("Compose 1.29 (docker-compose)", "Compose v2 (docker compose)"):
                if name not in found:
                    say(f"{name} is not installed: not run with it")
            if PROMETHEUS is None:
                say("no prometheus (Debian's package): the router is not scraped")
            for number, compose in enumerate(found.values()):
                workdir = tmp_path / str(number)
                workdir.mkdir()
                async with (
                    compose_up(compose, base, workdir) as project,
                    _scraped(project, workdir) as scraped,
                ):
                    await _drive(project, scraped)
    except NoEngine as why:
        if MODE == "require":
            raise AssertionError(f"ACP_ROUTER_COMPOSE_TEST=require, and {why}") from None
        pytest.skip(str(why))


@dataclass(frozen=True, slots=True)
class Scraped:
    """A Prometheus stand-in (Debian's ``prometheus``) scraping the router in its container
    through the published port, with deploy/prometheus/alerts.yml (``for`` holds removed)."""

    prometheus: Prometheus
    alerts: AlertReceiver

    async def backend_down(self, backend: str) -> None:
        """Wait for AcpRouterBackendDown to fire for ``backend``."""
        await self.alerts.wait_for(
            lambda alert: is_backend_down(alert) and alert["labels"]["backend"] == backend,
            timeout=STEP,
        )


@contextlib.asynccontextmanager
async def _scraped(project: Project, workdir: Path) -> AsyncIterator[Scraped | None]:
    if PROMETHEUS is None:
        yield None
        return
    async with receive_alerts() as alerts:
        config = prometheus_config(f"127.0.0.1:{project.port}", alerts.url, workdir)
        async with run_prometheus(config, workdir) as prometheus:
            yield Scraped(prometheus, alerts)


async def _drive(project: Project, scraped: Scraped | None) -> None:
    async with AcpClient.connect(project.url) as first:
        await first.initialize()
        session_id = await first.new_session(CWD)
        home = await prompt_answered(first, session_id)
    say(f"session/new {session_id}, prompt answered by {home}; disconnected")
    async with AcpClient.connect(project.url) as editor:
        await editor.initialize()
        assert "result" in await resume(editor, session_id)
        assert await prompt_answered(editor, session_id) == home, "resumed on another agent"
        say(f"new connection: session/resume, prompt answered by {home} again")
        async with aiohttp.ClientSession() as http:
            assert (await _get(http, f"{project.base}/healthz"))[0] == 200
            status, ready = await _get(http, f"{project.base}/readyz")
            assert status == 200, ready
            _, metrics = await _get(http, f"{project.base}/metrics")
            assert all(_backend_up(metrics, agent) for agent in agent_services()), metrics
            say(f"/healthz 200, /readyz 200 ({ready.strip()}), /metrics: every backend up")
            await _check_the_store(project, home)
            mark = len(project.router_log.lines)
            restarts = await _crash(project, home)
            say(f"killed {home}'s process (SIGKILL: a crash)")
            after = await prompt_answered(editor, session_id, FAILOVER)
            say(f"the same connection's next prompt answered by {after}")
            again = await _resume_and_prompt(project.url, session_id, FAILOVER)
            say(f"a new connection's session/resume and prompt answered by {again}")
            await project.router_log.wait_for(f"backend {home} is up", FAILOVER, start=mark)
            container = await project.container(home)
            counted = await docker("inspect", "--format", "{{.RestartCount}}", container)
            assert int(checked(counted, "docker inspect")) == restarts + 1
            _, metrics = await _get(http, f"{project.base}/metrics")
            assert _backend_up(metrics, home), metrics
            say(f"{home} restarted (restart: unless-stopped) and is back in the pool (/metrics)")
            await _stop_by_hand(project, editor, session_id, again, scraped)


async def _stop_by_hand(
    project: Project, editor: AcpClient, session_id: str, home: str, scraped: Scraped | None
) -> None:
    """An agent stopped by hand stays stopped: its sessions fail over to another agent,
    which reads them from the shared store; started again, it rejoins the pool. Where
    Prometheus scrapes the router, the agent's AcpRouterBackendDown fires."""
    await project.run("stop", home)
    say(f"stopped {home} by hand (compose stop: restart: unless-stopped leaves it stopped)")
    if scraped is not None:
        await scraped.backend_down(home)
        [up] = (await scraped.prometheus.api("query", query='up{job="acp-router"}'))["result"]
        assert up["value"][1] == "1", up
        say(f"Prometheus scrapes the router (up 1) and fired AcpRouterBackendDown for {home}")
    elsewhere = await prompt_answered(editor, session_id, FAILOVER)
    assert elsewhere != home, f"{home} is stopped, yet it answered"
    say(f"the same connection's next prompt answered by {elsewhere} (failover, the shared store)")
    assert await _resume_and_prompt(project.url, session_id) == elsewhere
    say(f"a new connection's session/resume and prompt answered by {elsewhere}")
    mark = len(project.router_log.lines)
    await project.run("start", home)
    await project.router_log.wait_for(f"backend {home} is up", FAILOVER, start=mark)
    say(f"{home} started again and back in the pool")


async def _check_the_store(project: Project, agent: str) -> None:
    """The agents run as uid 10001 and own the shared /store volume they write."""
    container = await project.container(agent)
    who = checked(await docker("exec", container, "id", "-u"), "docker exec id")
    owner = checked(
        await docker("exec", container, "stat", "--format", "%u:%g", "/store"), "stat /store"
    )
    assert (who.strip(), owner.strip()) == ("10001", "10001:10001")
    say(f"{agent} runs as uid 10001; /store (the shared volume) is 10001:10001")
