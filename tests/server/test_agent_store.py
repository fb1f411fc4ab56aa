"""The reference agent's session store: plain file I/O, no event loop."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from router.agent.store import (
    Lease,
    Message,
    SessionInfo,
    SessionStore,
    Speaker,
    is_valid_session_id,
)
from router.protocol.errors import ConfigError, SessionMoved
from tests.server.support import CREATED, lines_of


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore.open(tmp_path / "store")


def test_create_append_load_round_trip(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/work/a", CREATED)
    store.set_title(lease_a, "Fix the tests")
    store.append_message(lease_a, Message(Speaker.USER, "hello\nthere"))
    store.append_message(lease_a, Message(Speaker.AGENT, "[A] hello"))

    stored = store.load("sess_a")

    assert stored is not None
    assert stored.info.session_id == "sess_a"
    assert stored.info.cwd == "/work/a"
    assert stored.info.title == "Fix the tests"
    assert stored.history == (
        Message(Speaker.USER, "hello\nthere"),
        Message(Speaker.AGENT, "[A] hello"),
    )
    header = orjson.loads(lines_of(store, "sess_a")[0])
    assert header == {
        "kind": "header",
        "sessionId": "sess_a",
        "cwd": "/work/a",
        "createdAt": CREATED.isoformat(),
    }


def test_every_record_is_one_line(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/w", CREATED)
    store.append_message(lease_a, Message(Speaker.USER, "multi\nline\n"))
    assert [orjson.loads(line)["kind"] for line in lines_of(store, "sess_a")] == ["header", "user"]


def test_create_is_exclusive(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/w", CREATED)
    store.append_message(lease_a, Message(Speaker.USER, "kept"))
    with pytest.raises(FileExistsError):
        store.create("sess_a", "/elsewhere", CREATED)
    stored = store.load("sess_a")
    assert stored is not None
    assert stored.info.cwd == "/w"
    assert stored.history == (Message(Speaker.USER, "kept"),)


def test_append_needs_an_existing_session(store: SessionStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.append_message(Lease("sess_missing", "t"), Message(Speaker.USER, "x"))


def test_torn_last_line_is_ignored_and_not_glued_to_the_next(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/w", CREATED)
    store.append_message(lease_a, Message(Speaker.USER, "whole"))
    with store.path("sess_a").open("ab") as file:
        file.write(b'{"kind":"agent","text":"cut sh')  # a crash mid-record

    stored = store.load("sess_a")
    assert stored is not None
    assert stored.history == (Message(Speaker.USER, "whole"),)

    store.append_message(lease_a, Message(Speaker.AGENT, "after the crash"))
    stored = store.load("sess_a")
    assert stored is not None
    assert stored.history == (
        Message(Speaker.USER, "whole"),
        Message(Speaker.AGENT, "after the crash"),
    )


def test_unreadable_lines_are_skipped(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/w", CREATED)
    with store.path("sess_a").open("ab") as file:
        file.write(b"not json\n\n[1, 2]\n")
    store.append_message(lease_a, Message(Speaker.USER, "still here"))
    stored = store.load("sess_a")
    assert stored is not None
    assert stored.history == (Message(Speaker.USER, "still here"),)


def test_a_file_without_a_header_is_not_a_session(store: SessionStore) -> None:
    store.root.joinpath("sess_bad.jsonl").write_bytes(b'{"kind":"user","text":"x"}\n')
    assert store.load("sess_bad") is None
    assert not store.exists("sess_bad")
    assert store.list_sessions() == []


@pytest.mark.parametrize(
    "session_id", ["", "../etc/passwd", "a/b", "sess.x", "sess a", "x" * 129, "é"]
)
def test_ids_that_cannot_be_file_names_are_unknown(store: SessionStore, session_id: str) -> None:
    assert not is_valid_session_id(session_id)
    assert not store.exists(session_id)
    assert store.load(session_id) is None
    assert store.info(session_id) is None
    with pytest.raises(ValueError, match="not a valid session id"):
        store.path(session_id)


def test_valid_ids() -> None:
    assert is_valid_session_id("sess_0123abcd")
    assert is_valid_session_id("A-b_9" * 25 + "xyz")  # 128 characters
    assert not is_valid_session_id(None)


def test_list_sessions_reads_heads(store: SessionStore) -> None:
    lease_a = store.create("sess_a", "/w/a", CREATED)
    store.set_title(lease_a, "first")
    store.create("sess_b", "/w/b", CREATED)
    store.root.joinpath("notes.txt").write_text("not a session")
    store.root.joinpath("bad name.jsonl").write_text("{}\n")

    infos = {info.session_id: info for info in store.list_sessions()}

    assert set(infos) == {"sess_a", "sess_b"}
    assert (infos["sess_a"].cwd, infos["sess_a"].title) == ("/w/a", "first")
    assert (infos["sess_b"].cwd, infos["sess_b"].title) == ("/w/b", None)


def test_updated_at_is_the_file_mtime_in_utc(store: SessionStore) -> None:
    store.create("sess_a", "/w", CREATED)
    moment = datetime(2026, 8, 1, 10, 0, 5, 250_000, tzinfo=UTC).timestamp()
    os.utime(store.path("sess_a"), (moment, moment))
    info = store.info("sess_a")
    assert info is not None
    assert info.updated_at == "2026-08-01T10:00:05.250Z"
    assert SessionInfo("s", "/w", None, 0).updated_at == "1970-01-01T00:00:00.000Z"


def test_open_creates_missing_folders(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    assert SessionStore.open(root).root == root
    assert root.is_dir()


def test_open_rejects_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(ConfigError, match="--store"):
        SessionStore.open(path)


# -- fencing: one writer per session ------------------------------------------------------------


def test_a_take_fences_the_previous_holder(store: SessionStore) -> None:
    first = store.create("sess_a", "/w", CREATED)
    store.append_message(first, Message(Speaker.USER, "mine"))
    second = store.take("sess_a")
    assert second is not None
    assert (store.holds(first), store.holds(second)) == (False, True)
    before = store.path("sess_a").read_bytes()

    with pytest.raises(SessionMoved) as moved:
        store.append_message(first, Message(Speaker.AGENT, "too late"))
    with pytest.raises(SessionMoved):
        store.set_title(first, "too late")
    assert moved.value.code == -32010
    assert moved.value.data == {"sessionId": "sess_a", "retryable": False}
    assert store.path("sess_a").read_bytes() == before

    store.append_message(second, Message(Speaker.AGENT, "theirs"))
    stored = store.load("sess_a")
    assert stored is not None
    assert [m.text for m in stored.history] == ["mine", "theirs"]


def test_take_of_an_unknown_session_is_none(store: SessionStore) -> None:
    assert store.take("sess_missing") is None
    assert store.take("../etc/passwd") is None
    assert not store.holds(Lease("sess_missing", "t"))


def test_leases_are_not_sessions(store: SessionStore) -> None:
    store.create("sess_a", "/w", CREATED)
    store.take("sess_a")
    assert store.lease_path("sess_a").exists()
    assert [info.session_id for info in store.list_sessions()] == ["sess_a"]
    assert sorted(p.name for p in store.root.iterdir()) == ["sess_a.jsonl", "sess_a.lease"]
