"""Fixtures for ``acp-router host``: the host as a real subprocess in front of a real stdio
agent (one built on the official Python SDK, or on the TypeScript SDK run with node).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import CliProcess, run_cli

INTEROP = Path(__file__).parent / "interop"
#: the Python SDK echo agent, run with this interpreter
SDK_AGENT = (sys.executable, "-m", "tests.agents.sdk_echo_agent")
#: the TypeScript SDK agent; its packages come from tests/interop (``make interop``)
TS_AGENT = (str(INTEROP / "ts_status_agent.mjs"),)
TS_SDK = INTEROP / "node_modules" / "@agentclientprotocol" / "sdk"


@dataclass(frozen=True, slots=True)
class HostProcess:
    url: str
    host_id: str
    cli: CliProcess


@asynccontextmanager
async def start_host(host_id: str, *command: str) -> AsyncIterator[HostProcess]:
    """``acp-router host`` on a free loopback port in front of ``command``."""
    args = ("host", "--listen", "127.0.0.1:0", "--id", host_id, "--", *command)
    async with run_cli(*args, ready_timeout=30.0) as cli:
        prefix = f"host {host_id} listening on "
        assert cli.first_line.startswith(prefix), cli.first_line
        yield HostProcess(cli.first_line.removeprefix(prefix), host_id, cli)


def node_command() -> tuple[str, ...]:
    """``node`` and the TypeScript agent, or skip: only when node is absent
    (``.ci/run`` installs it; the SDK itself must then be there, from ``make interop``)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the TypeScript SDK agent cannot run")
    assert TS_SDK.is_dir(), "run `make interop` (npm ci in tests/interop) first"
    return (node, *TS_AGENT)


PID_TAG = re.compile(r"^\[pid (\d+)\] ")


def pid_of(text: str) -> int:
    """The agent process an echo names: ``[pid 42] hello`` -> 42."""
    match = PID_TAG.match(text)
    assert match is not None, text
    return int(match.group(1))
