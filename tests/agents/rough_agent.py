"""A stdio "agent" that misbehaves on purpose, for the host's failure paths.

``python -m tests.agents.rough_agent MODE``:

* ``silent``: never answers ``initialize``.
* ``refuse``: answers ``initialize`` with an error.
* ``once FILE``: initializes the first time (creating FILE), then answers nothing; later
  runs exit at once, as an agent that cannot come back would.
* ``noisy``: writes a blank line and a line that is not JSON-RPC, then initializes;
  after that it answers nothing, and ignores SIGTERM and the end of its stdin (so
  stopping it takes SIGKILL).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(mode: str, *args: str) -> None:
    if mode == "once":
        marker = Path(args[0])
        if marker.exists():
            sys.exit(3)
        marker.touch()
    line = sys.stdin.readline()
    request = json.loads(line)
    if mode == "silent":
        threading.Event().wait()
    if mode == "refuse":
        error = {"code": -32603, "message": "no"}
        say(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}))
        return
    if mode == "noisy":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("")
        say("this is not JSON-RPC")
    result = {"protocolVersion": 1, "agentCapabilities": {}}
    say(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}))
    for _ in sys.stdin:
        pass
    if mode == "noisy":
        threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:])
