"""deploy/Dockerfile and docker-compose.yml, run: the file checked by Compose 1.29
(Debian's ``docker-compose``) and v2 where they are installed, then the compose topology
run as local processes. Where a Docker engine and the base image are present, the image is
built and started; elsewhere that test skips, saying which is missing
(tests/server/test_deploy_compose.py: the files parsed and checked against the repository
and the Compose Specification)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from router.server.config import load_settings
from tests.engine import PULLED_BASE, STAND_IN, has_image
from tests.server.support import base_images, exec_form, healthcheck_url
from tests.support import WAIT, run_cli_to_exit, run_to_exit
from tests.topology import (
    COMPOSE_FILE,
    DOCKERFILE,
    REPO,
    compose,
    router_config_file,
    run_compose_topology,
)

# -- the Compose versions people have -------------------------------------------------------

DOCKER = shutil.which("docker")
DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose not installed (Compose 1.29, Debian's docker-compose; .ci/run installs it)",
)
async def test_compose_1_29_accepts_the_file() -> None:
    assert DOCKER_COMPOSE is not None
    version = await run_to_exit(DOCKER_COMPOSE, "version", "--short")
    assert version.returncode == 0, version.stderr
    run = await run_to_exit(DOCKER_COMPOSE, "--file", str(COMPOSE_FILE), "config")
    assert run.returncode == 0, f"docker-compose {version.stdout.strip()}: {run.stderr}"
    resolved = yaml.safe_load(run.stdout)
    assert resolved["services"].keys() == compose()["services"].keys()
    assert resolved["services"]["router"]["image"] == compose()["services"]["router"]["image"]


async def test_compose_v2_accepts_the_file() -> None:
    if DOCKER is None or (await run_to_exit(DOCKER, "compose", "version")).returncode != 0:
        pytest.skip(
            "Compose v2 (the docker compose plugin) not installed: the file is checked against"
            " the Compose Specification's schema instead"
        )
    run = await run_to_exit(DOCKER, "compose", "--file", str(COMPOSE_FILE), "config", "--quiet")
    assert run.returncode == 0, run.stderr


# -- the topology, run as processes -------------------------------------------------------------


async def _healthcheck(port: int) -> int:
    """Run the image's HEALTHCHECK command (this interpreter for ``python``) against ``port``."""
    argv = exec_form("HEALTHCHECK")
    code = argv[-1].replace(healthcheck_url(), f"http://127.0.0.1:{port}/healthz")
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv[1:-1], code, stderr=asyncio.subprocess.DEVNULL
    )
    async with asyncio.timeout(WAIT):
        return await process.wait()


async def test_compose_topology_serves_acp_router_connect(tmp_path: Path) -> None:
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}},
    ]  # fmt: skip
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    async with run_compose_topology(tmp_path) as topology:
        port = int(topology.address.rpartition(":")[2])
        run = await run_cli_to_exit("connect", topology.url, stdin=stdin)
        assert await _healthcheck(port) == 0
    assert run.returncode == 0, run.stderr
    replies: list[dict[str, Any]] = [json.loads(line) for line in run.stdout.splitlines()]
    assert [reply["id"] for reply in replies] == [0, 1]
    assert replies[0]["result"]["agentCapabilities"]["sessionCapabilities"]["status"] == {}
    assert replies[1]["result"]["sessionId"]
    assert await _healthcheck(port) != 0, "nothing listens any more: the check must fail"


# -- the image, where a Docker engine runs ------------------------------------------------------


async def _base_or_why_not() -> tuple[str | None, str]:
    """The base image to build on (the Dockerfile's, or the stand-in ``make compose-test``
    made: tests/engine.py), or None and why the image cannot be built and started here."""
    if DOCKER is None:
        return None, "no docker command: no Docker engine to build the image with"
    info = await run_to_exit(DOCKER, "info", "--format", "{{.ServerVersion}}")
    if info.returncode != 0:
        said = (info.stderr.strip().splitlines() or ["no output"])[0]
        return None, f"no Docker engine answers `docker info`: {said}"
    for base in (*sorted(base_images()), STAND_IN):
        if await has_image(base):
            return base, ""
    return None, (
        f"neither the base image {PULLED_BASE} (docker pull {PULLED_BASE}) nor its stand-in"
        f" {STAND_IN} (make compose-test makes it) is in the Docker engine"
    )


async def _wait_for_line(container: str, text: str) -> None:
    assert DOCKER is not None
    logs = await asyncio.create_subprocess_exec(
        DOCKER, "logs", "--follow", container,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert logs.stdout is not None
    try:
        async with asyncio.timeout(WAIT):
            while text not in (line := (await logs.stdout.readline()).decode()):
                assert line, f"the container stopped before it logged {text!r}"
    finally:
        if logs.returncode is None:
            logs.kill()
        await logs.wait()


@contextlib.asynccontextmanager
async def _built_image(base: str) -> AsyncIterator[str]:
    assert DOCKER is not None
    tag = f"acp-router:test-{secrets.token_hex(4)}"
    build = await run_to_exit(
        DOCKER, "build", "--force-rm", "--file", str(DOCKERFILE), "--tag", tag,
        "--build-arg", f"PYTHON_IMAGE={base}", str(REPO), timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    try:
        yield tag
    finally:
        await run_to_exit(DOCKER, "image", "rm", "--force", tag)


@pytest.mark.timeout(900)
async def test_the_image_builds_and_answers_healthz() -> None:
    base, reason = await _base_or_why_not()
    if base is None:
        pytest.skip(reason)
    assert DOCKER is not None
    config = router_config_file()
    port = load_settings(config).router.address[1]
    async with _built_image(base) as tag:
        started = await run_to_exit(
            DOCKER, "run", "--detach", "--publish", f"127.0.0.1::{port}",
            "--volume", f"{config}:/etc/acp-router/router.toml:ro", tag,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        container = started.stdout.strip()
        try:
            await _wait_for_line(container, "acp-router listening on")
            published = await run_to_exit(DOCKER, "port", container, f"{port}/tcp")
            address = re.findall(r"127\.0\.0\.1:\d+", published.stdout)[0]
            async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
                async with http.get(f"http://{address}/healthz") as response:
                    assert response.status == 200
            # the image's own HEALTHCHECK command, run inside it, passes too
            check = await run_to_exit(DOCKER, "exec", container, *exec_form("HEALTHCHECK"))
            assert check.returncode == 0, check.stderr
        finally:
            await run_to_exit(DOCKER, "rm", "--force", container)
