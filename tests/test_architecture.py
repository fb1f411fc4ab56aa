"""The routing core stays sans-I/O: importing it pulls in no event loop or network library."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "router.protocol.errors",
    "router.protocol.jsonrpc",
    "router.protocol.acp",
    "router.core.placement",
    "router.core.locate",
    "router.core.routes",
    "router.core.listing",
    "router.core.frontdoor",
    "router.core.quotas",
]
IO_MODULES = ["asyncio", "aiohttp", "websockets", "socket", "selectors"]


def test_the_core_imports_no_io_library() -> None:
    probe = (
        f"import sys\nfor m in {CORE!r}: __import__(m)\n"
        f"print(','.join(m for m in {IO_MODULES!r} if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert found == "", f"the sans-I/O core imported {found}"
