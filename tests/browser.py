"""Headless Chromium driven over the DevTools protocol, for testing the status page.

Debian's ``chromium`` runs with ``--remote-debugging-port=0``; the test talks to one
page over a WebSocket (the ``websockets`` library): navigate, wait for the load event,
evaluate script. Waiting in the page is done by a MutationObserver, not by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import websockets

from router.tasks import cancel_and_wait
from tests.support import WAIT

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None
)


class Page:
    """One browser tab."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def read(self) -> None:
        async for frame in self._ws:
            message = json.loads(frame)
            if "id" in message:
                answer = self._answers.pop(message["id"])
                if "error" in message:
                    answer.set_exception(RuntimeError(message["error"]))
                else:
                    answer.set_result(message.get("result"))
            else:
                self._events.put_nowait(message)

    async def call(self, method: str, **params: Any) -> Any:
        call_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._answers[call_id] = answer
        await self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        async with asyncio.timeout(WAIT):
            return await answer

    async def open(self, url: str) -> None:
        """Navigate to ``url`` and wait for its load event."""
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        async with asyncio.timeout(WAIT):
            while (await self._events.get())["method"] != "Page.loadEventFired":
                pass

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited when it is a promise); a thrown error raises."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(result["exceptionDetails"])
        return result["result"].get("value")

    async def wait_for(self, selector: str, condition: str) -> Any:
        """Wait until ``condition`` (a JS expression over ``root``, the element at
        ``selector``) is truthy, re-checked on every change below ``root``; its value."""
        return await self.evaluate(
            f"""new Promise((resolve, reject) => {{
                const root = document.querySelector({json.dumps(selector)});
                const check = () => {{ const value = ({condition});
                    if (value) {{ observer.disconnect(); resolve(value); }} }};
                const observer = new MutationObserver(check);
                observer.observe(root, {{childList: true, subtree: true, characterData: true}});
                setTimeout(() => {{ observer.disconnect();
                    reject(new Error("timed out: " + root.innerText)); }}, {int(WAIT * 1000)});
                check();
            }})"""
        )


@contextlib.asynccontextmanager
async def open_page(profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium with one blank page, for the duration of the block."""
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--no-first-run",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(WAIT):
            while not (line := (await process.stderr.readline()).decode()).startswith(
                "DevTools listening on "
            ):
                assert line, "chromium exited before it listened"
        browser = line.removeprefix("DevTools listening on ").strip()
        endpoint = browser.split("ws://", 1)[1].split("/", 1)[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{endpoint}/json/list") as listing:
                targets = await listing.json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        try:
            async with websockets.connect(url, max_size=None) as ws:
                page = Page(ws)
                reader = asyncio.create_task(page.read())
                try:
                    yield page
                finally:
                    await cancel_and_wait(reader)
        finally:
            await _close(browser, process)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def _close(browser: str, process: asyncio.subprocess.Process) -> None:
    """Ask the browser to close, and wait for it to exit: a clean exit removes the folder
    it made in the temporary folder (``org.chromium.Chromium.*``), which SIGTERM leaves
    behind."""
    with contextlib.suppress(OSError, TimeoutError, websockets.WebSocketException):
        async with asyncio.timeout(WAIT):
            async with websockets.connect(browser) as ws:
                await ws.send(json.dumps({"id": 1, "method": "Browser.close"}))
                await ws.recv()
            await process.wait()
