"""Envelope: :func:`router.protocol.reading.parse` and :func:`router.protocol.splice.replace_id` on
ACP-shaped frames, in process.

* ``parse`` against ``json.loads`` of the same text (the stdlib decoder), and against
  ``orjson.loads`` (what ``parse`` decoded with before it read only the envelope, with
  msgspec: below 1x, the envelope reader wins);
* ``replace_id`` against decoding with ``json.loads``, setting ``id`` and encoding
  with ``orjson.dumps``.

The frames are built to the sizes of ACP traffic (the envelope rows of BENCHMARKS.md): a 309 B
``session/update`` chunk, a ~3.7 KB ``session/prompt`` and a ~74 KB history result;
and two 1 MiB prompts: one text block, and ``[{},{},...]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from bench.ratios import Budget, Row, micro, row
from bench.timing import interleaved
from bench.wire import BenchError
from router.protocol.reading import parse
from router.protocol.splice import replace_id

BENCH = "envelope"
HISTORY_BYTES = 74342
SESSION = "sess_4f1c2b7d9e0a4c6b8d2e1f3a5b7c9d0e"
FILLER = (
    "the router forwards every frame as the text it arrived in and only splices ids "
    "so unknown fields and _meta survive the hop byte for byte while sessions move "
)

NEW_ID = 1001
DECODERS: list[tuple[str, Callable[[str], Any]]] = [
    ("json.loads", json.loads),
    ("orjson.loads", orjson.loads),
]

Build = Callable[[str], dict[str, Any]]


def _text(length: int, seed: int = 0) -> str:
    vocabulary = FILLER.split()
    words = (vocabulary[(seed + i) % len(vocabulary)] for i in range(length))
    return " ".join(words)[:length]


def _sized(build: Build, size: int) -> str:
    """The frame ``build`` makes, its padding text chosen so it is ``size`` bytes."""
    bare = len(orjson.dumps(build("")))
    return orjson.dumps(build(_text(size - bare))).decode()


def _chunk(text: str) -> dict[str, Any]:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


def update_frame() -> str:
    def build(text: str) -> dict[str, Any]:
        params = {"sessionId": SESSION, "update": _chunk(text)}
        return {"jsonrpc": "2.0", "method": "session/update", "params": params}

    return _sized(build, 309)


def prompt_frame() -> str:
    def build(text: str) -> dict[str, Any]:
        link = {"type": "resource_link", "uri": "file:///work/project/README.md", "name": "README"}
        prompt = [{"type": "text", "text": text}, link]
        params = {"sessionId": SESSION, "prompt": prompt}
        return {"jsonrpc": "2.0", "id": 12, "method": "session/prompt", "params": params}

    return _sized(build, 3671)


def history_frame() -> str:
    turns: list[dict[str, Any]] = []

    def build(text: str) -> dict[str, Any]:
        result = {"sessionId": SESSION, "history": [*turns, _chunk(text)]}
        return {"jsonrpc": "2.0", "id": 7, "result": result}

    while len(orjson.dumps(build(""))) < HISTORY_BYTES - 600:
        turns.append(_chunk(_text(120 + (len(turns) * 37) % 400, len(turns))))
    return _sized(build, HISTORY_BYTES)


def permission_frame() -> str:
    options = [
        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
    ]
    tool_call = {"toolCallId": "call_1", "title": "Edit README.md", "status": "pending"}
    params = {"sessionId": SESSION, "toolCall": tool_call, "options": options}
    message = {"jsonrpc": "2.0", "id": 3, "method": "session/request_permission", "params": params}
    return orjson.dumps(message).decode()


def large_prompt_frame(size: int) -> str:
    """A ``session/prompt`` whose one text block fills ``size`` bytes."""

    def build(text: str) -> dict[str, Any]:
        params = {"sessionId": SESSION, "prompt": [{"type": "text", "text": text}]}
        return {"jsonrpc": "2.0", "id": 12, "method": "session/prompt", "params": params}

    return _sized(build, size)


def empty_objects_frame(size: int) -> str:
    """A ``session/prompt`` whose prompt is ``[{},{},...]`` to ``size`` bytes: the shape
    that costs a decoder the most objects per byte."""
    head = f'{{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{{"sessionId":"{SESSION}","prompt":['
    count = (size - len(head) - 4) // 3
    return head + ",".join(["{}"] * count) + "]}}"


def _reencoded(text: str, new_id: int) -> str:
    obj = json.loads(text)
    obj["id"] = new_id
    return orjson.dumps(obj).decode()


def run(budget: Budget) -> list[Row]:
    target = budget.size(0.02, 0.008)
    rows = []
    for kind, frame in [("update", update_frame()), ("prompt", prompt_frame())]:
        rows += _parse_rows(kind, frame, budget.rounds, target)
    history = history_frame()
    rows += _parse_rows("history", history, budget.rounds, target)
    rows += _parse_rows("prompt", large_prompt_frame(1 << 20), budget.rounds, target)
    rows += _parse_rows("[{},...]", empty_objects_frame(1 << 20), budget.rounds, target)
    for kind, frame in [("permission", permission_frame()), ("prompt", prompt_frame())]:
        rows.append(_replace_id_row(kind, frame, budget.rounds, target))
    rows.append(_replace_id_row("history", history, budget.rounds, target))
    return rows


def _parse_rows(kind: str, frame: str, rounds: int, target: float) -> list[Row]:
    label = f"parse {kind} {len(frame):,} B"
    rows = []
    for name, decode in DECODERS:
        pairs = interleaved(partial(parse, frame), partial(decode, frame), rounds, target)
        rows.append(row(BENCH, label, name, micro(pairs), "us"))
    return rows


def _replace_id_row(kind: str, frame: str, rounds: int, target: float) -> Row:
    if orjson.loads(replace_id(frame, NEW_ID)) != orjson.loads(_reencoded(frame, NEW_ID)):
        raise BenchError(f"replace_id and the baseline disagree on the {kind} frame")
    subject, baseline = partial(replace_id, frame, NEW_ID), partial(_reencoded, frame, NEW_ID)
    pairs = interleaved(subject, baseline, rounds, target)
    label = f"replace_id {kind} {len(frame):,} B"
    return row(BENCH, label, "json.loads+orjson.dumps", micro(pairs), "us")
