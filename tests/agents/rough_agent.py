"""A stdio "agent" that misbehaves on purpose, for the host's failure paths.

``python -m tests.agents.rough_agent MODE``:

* ``silent``: never answers ``initialize``.
* ``refuse``: answers ``initialize`` with an error.
* ``once FILE``: initializes the first time (creating FILE), then answers nothing; later
  runs exit at once, as an agent that cannot come back would.
* ``noisy``: writes a blank line and a line that is not JSON-RPC, then initializes;
  after that it answers nothing, and ignores SIGTERM and the end of its stdin (so
  stopping it takes SIGKILL).
* ``family``: like ``noisy`` (without the noise), and first starts a child of its own
  that ignores SIGTERM too and holds the agent's pipes; writes ``grandchild PID`` to
  stderr.
* ``refuse-sessions``: initializes, then refuses every request as an agent whose
  model client cannot start would: its reason on stderr, ``Query closed before
  response received`` as the answer. ``session/prompt`` instead makes it write a last
  word to stderr and exit, owing the answer.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

STUBBORN = "import signal, threading; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + (
    "threading.Event().wait()"
)
REASON = "Error: --dangerously-skip-permissions cannot be used with root/sudo privileges"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def complain(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def refuse_sessions() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("method") == "session/prompt":
            complain("fatal: the model client crashed")
            sys.exit(1)
        complain("starting the model client")
        complain(REASON)
        error = {"code": -32603, "message": "Query closed before response received"}
        say(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}))


def main(mode: str, *args: str) -> None:
    if mode == "family":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", STUBBORN])
        complain(f"grandchild {child.pid}")
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
    result = {"protocolVersion": 1, "agentCapabilities": {}, "_meta": {"agent": "rough"}}
    say(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}))
    if mode == "refuse-sessions":
        refuse_sessions()
    for _ in sys.stdin:
        pass
    if mode in ("noisy", "family"):
        threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:])
