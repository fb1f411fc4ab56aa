"""The docker-compose topology as local processes.

No Docker engine runs here, so the tests run what ``docker-compose.yml`` describes as real
subprocesses: each agent service's command, then the router's command on the mounted
``config/compose.toml``. Only addresses change: listen addresses become free loopback
ports, the store volume a temporary folder, and each backend URL (a compose service name)
the URL its agent announced. Every other value is the file's own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from router.server.config import load_settings
from tests.support import AgentProcess, CliProcess, run_cli

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def command_of(service: dict[str, Any]) -> list[str]:
    command: list[str] = service["command"]
    assert isinstance(command, list), "write compose commands as lists: no shell parsing"
    return command


def option(command: Sequence[str], name: str) -> str:
    """The value that follows ``name`` in an argv."""
    return command[command.index(name) + 1]


def with_option(command: Sequence[str], name: str, value: str) -> list[str]:
    changed = list(command)
    changed[changed.index(name) + 1] = value
    return changed


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository file of each ``./source:/target[:ro]`` volume."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def agent_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose()["services"]
    return {name: s for name, s in services.items() if s.get("command", [])[:1] == ["agent"]}


def router_config_file() -> Path:
    """The repository file the compose router reads as its --config."""
    router = compose()["services"]["router"]
    return bind_mounts(router)[option(command_of(router), "--config")]


def localized_config(agents: Sequence[AgentProcess]) -> str:
    """The compose router config with its listen address on a free loopback port and
    each backend's URL replaced by the URL of the running agent with the same id."""
    source = router_config_file()
    settings = load_settings(source)
    urls = {agent.agent_id: agent.url for agent in agents}
    assert set(urls) == {b.id for b in settings.backends}, "one agent service per backend"
    text = source.read_text()
    text = text.replace(f'"{settings.router.listen}"', '"127.0.0.1:0"')
    for backend in settings.backends:
        text = text.replace(f'"{backend.url}"', f'"{urls[backend.id]}"')
    return text


@dataclass(frozen=True, slots=True)
class Topology:
    router: CliProcess
    #: ws://127.0.0.1:PORT/acp, the router's announced front door
    url: str
    agents: list[AgentProcess]

    @property
    def address(self) -> str:
        """HOST:PORT of the router, as a Prometheus target."""
        return self.url.removeprefix("ws://").removesuffix("/acp")

    @property
    def base(self) -> str:
        return f"http://{self.address}"


@contextlib.asynccontextmanager
async def start_compose_agent(command: Sequence[str], store: Path) -> AsyncIterator[AgentProcess]:
    local = with_option(with_option(command, "--listen", "127.0.0.1:0"), "--store", str(store))
    async with run_cli(*local) as cli:
        agent_id = option(command, "--id")
        prefix = f"agent {agent_id} listening on "
        assert cli.first_line.startswith(prefix), cli.first_line
        yield AgentProcess(cli.first_line.removeprefix(prefix), agent_id, cli)


@contextlib.asynccontextmanager
async def run_compose_topology(workdir: Path) -> AsyncIterator[Topology]:
    """Start the compose agents and router; yield once the router has every backend up."""
    store = workdir / "store"  # the compose file's named volume, shared by the agents
    store.mkdir()
    async with contextlib.AsyncExitStack() as stack:
        agents = await asyncio.gather(
            *(
                stack.enter_async_context(start_compose_agent(command_of(service), store))
                for service in agent_services().values()
            )
        )
        config = workdir / "router.toml"
        config.write_text(localized_config(agents))
        command = with_option(command_of(compose()["services"]["router"]), "--config", str(config))
        router = await stack.enter_async_context(run_cli(*command))
        for agent in agents:
            await router.wait_for_log(f"backend {agent.agent_id} is up")
        url = router.first_line.removeprefix("acp-router listening on ")
        yield Topology(router, url, list(agents))
