"""The reference agent's session store (router.agent.store) shared by two processes: a
take fences the other's appends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from router.agent.store import SessionStore
from tests.server.support import CREATED, lines_of

_TAKER = """
import sys
from pathlib import Path
from router.agent.store import Message, SessionStore, Speaker
from router.protocol.errors import SessionMoved
store = SessionStore(Path(sys.argv[1]))
name, rounds = sys.argv[2], int(sys.argv[3])
for take in range(rounds):
    lease = store.take("sess_shared")
    try:
        for n in range(20):
            store.append_message(lease, Message(Speaker.USER, f"{name}:{take}:{n}"))
    except SessionMoved:
        pass
"""


def test_two_processes_taking_turns_never_interleave(tmp_path: Path) -> None:
    """Two processes keep taking one session and appending until fenced: every record
    is whole, and once a take's records stop, no record of that take comes later."""
    store = SessionStore.open(tmp_path / "store")
    store.create("sess_shared", "/w", CREATED)
    writers = [
        subprocess.Popen([sys.executable, "-c", _TAKER, str(store.root), name, "60"])
        for name in ("left", "right")
    ]
    assert [writer.wait(timeout=60) for writer in writers] == [0, 0]

    lines = [line for line in lines_of(store, "sess_shared") if line != b"\n"]
    assert all(line.endswith(b"\n") for line in lines)
    takes = [orjson.loads(line)["text"].rpartition(":")[0] for line in lines[1:]]
    runs = [take for n, take in enumerate(takes) if n == 0 or takes[n - 1] != take]
    assert len(runs) == len(set(runs)), "a fenced take appended after another take"
    assert {run.partition(":")[0] for run in runs} == {"left", "right"}
