"""The descriptor reserve of the front door: a router subprocess started under a low
RLIMIT_NOFILE answers new connections 503 near its limit (tests/server/test_deadlines.py:
the deadlines and limits on every connection)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path

import pytest

from tests.fleet import inactive, start_scripted
from tests.server.support import raw
from tests.support import WAIT, cli_command


async def status_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """The status line the router answers a plain GET /healthz with."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    async with asyncio.timeout(WAIT):
        return await reader.readline()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descriptors lowest first")
async def test_near_the_open_file_limit_new_connections_get_503(tmp_path: Path) -> None:
    async with start_scripted("a", inactive) as backend:
        config = tmp_path / "router.toml"
        config.write_text(
            f'[router]\nlisten = "127.0.0.1:0"\n[[backends]]\nid = "a"\nurl = "{backend.url}"\n'
        )
        command = " ".join(cli_command("serve", "--config", str(config)))
        process = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            f"ulimit -n 64 && exec {command}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(WAIT):
                line = (await process.stdout.readline()).decode()
            match = re.search(r"listening on ws://127\.0\.0\.1:(\d+)/acp", line)
            assert match is not None, line
            statuses: list[bytes] = []
            async with contextlib.AsyncExitStack() as stack:
                while len(statuses) < 64 and statuses[-1:] != [b"HTTP/1.1 503"]:
                    connection = await stack.enter_async_context(raw(int(match.group(1))))
                    statuses.append((await status_of(*connection)).rstrip(b"\r\n")[:12])
            # descriptors run out (90 % of 64) well before 64 connections: the last is
            # refused, every one before it was served (and kept open)
            assert statuses[-1] == b"HTTP/1.1 503", statuses
            assert set(statuses[:-1]) == {b"HTTP/1.1 200"}
            assert len(statuses) < 58
        finally:
            process.terminate()
            async with asyncio.timeout(WAIT):
                _, stderr = await process.communicate()
        assert b"refused a connection" in stderr
