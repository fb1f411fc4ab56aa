"""What the router's log says about a backend that is down: the change of state once (the
first failure, or ``is down``), then ``is up`` with how long and how many attempts, and the
attempts in between at debug level only. Read from a real ``acp-router serve`` whose
backend sits behind a relay that refuses and then passes again."""

from __future__ import annotations

import re
from pathlib import Path

from tests.e2e.support import write_config
from tests.relay import start_relay
from tests.support import CliProcess, run_cli, start_agent

#: retries every few milliseconds: many failed attempts within a test's wait
FAST_RETRY = "[control]\nreconnect_initial_ms = 5\nreconnect_max_ms = 20\n"
ATTEMPTS = 5
RECOVERED = re.compile(r"is up \(\S+\) after (\d+\.\d) s down, (\d+) failed attempts?$")


def lines(serve: CliProcess, start: int, end: int, level: str) -> list[str]:
    """The control link's lines at ``level`` in stderr lines ``start`` to ``end``."""
    return [
        line.rstrip("\n")
        for line in serve.stderr.lines[start:end]
        if f" {level} router.server.links.control: " in line
    ]


async def wait_for_attempt(serve: CliProcess, attempt: int, start: int) -> None:
    await serve.wait_for_log(f"control link failed again (attempt {attempt})", start=start)


async def test_a_down_backend_is_logged_once_then_its_recovery(tmp_path: Path) -> None:
    async with (
        start_agent(tmp_path / "store", "agent-1") as agent,
        start_relay(agent.url) as relay,
    ):
        await relay.refuse()  # nothing listens at the backend's address from the start
        config = write_config(tmp_path / "router.toml", [("agent-1", relay.url)], extra=FAST_RETRY)
        async with run_cli("--log-level", "DEBUG", "serve", "--config", str(config)) as serve:
            # 1. down from the start: one line for the first failure, then only debug lines
            await wait_for_attempt(serve, ATTEMPTS, 0)
            await relay.listen()
            up = await serve.wait_for_log("backend agent-1 is up")
            first_up = serve.stderr.lines.index(up)
            [failed] = lines(serve, 0, first_up, "INFO")
            assert "backend agent-1 control link failed: " in failed, failed
            assert "retrying" in failed
            assert lines(serve, 0, first_up, "WARNING") == []
            retries = lines(serve, 0, first_up, "DEBUG")
            assert len(retries) >= ATTEMPTS - 1
            found = RECOVERED.search(up.rstrip("\n"))
            assert found is not None, up
            assert int(found[2]) == len(retries) + 1  # the first failure and every retry

            # 2. an open link breaks: "is down" once, the retries at debug, then "is up"
            await relay.refuse()
            down = await serve.wait_for_log("backend agent-1 is down", start=first_up)
            went_down = serve.stderr.lines.index(down)
            await wait_for_attempt(serve, ATTEMPTS, went_down)
            await relay.listen()
            up = await serve.wait_for_log("backend agent-1 is up", start=went_down)
            back_up = serve.stderr.lines.index(up)
            assert lines(serve, first_up, back_up, "WARNING") == [down.rstrip("\n")]
            quiet = lines(serve, went_down + 1, back_up, "INFO")
            assert not [line for line in quiet if "control link failed" in line], quiet
            retries = lines(serve, went_down, back_up, "DEBUG")
            assert len(retries) >= ATTEMPTS
            found = RECOVERED.search(up.rstrip("\n"))
            assert found is not None, up
            assert int(found[2]) == len(retries)
            assert await serve.stop() == 0
