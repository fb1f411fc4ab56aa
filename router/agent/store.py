"""The session store: one append-only JSON-lines file per session, ``<root>/<sessionId>.jsonl``.

Several agent processes may share one store. A file is created with ``O_CREAT|O_EXCL``
and every record is appended with one ``os.write`` of the whole line on an ``O_APPEND``
descriptor, so a crash loses at most the record being written; readers skip a torn or
unreadable line. A session's ``updatedAt`` is its file's mtime. Plain blocking file I/O,
no asyncio: the records are small.

**Fencing.** Only one instance may append to a session: the one that took it last. An
instance takes a session (on ``session/new``, ``session/load``, ``session/resume``) by
writing a fresh random token to ``<root>/<sessionId>.lease`` (a temporary file, then
``rename()`` over the old lease: atomic, so a reader sees one token or the other), and
appends only while that file still holds its token. Taking and check-then-append each
run under ``flock(LOCK_EX)`` on the session file, held for that one operation and
released when the descriptor closes (a crashed process releases it too), so a takeover
can never fall between an append's check and its write. An instance whose session was
taken learns it on its next append (:class:`SessionMoved`) or check (:meth:`holds`).

**Epochs.** A session's epoch, the fencing token a router sends with each resume
(docs/routing.md, "Split brain found is split brain ended"), is kept in
``<root>/<sessionId>.epoch`` (written to a temporary file, then renamed over the old
one), so that ``session/status`` reports it, for a copy that is not in memory too, with
one small read.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from router.protocol.errors import ConfigError, SessionMoved
from router.protocol.jsontext import dumps, loads

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl"
LEASE_SUFFIX = ".lease"
EPOCH_SUFFIX = ".epoch"
#: A session id is a file name stem: nothing else ever reaches the file system.
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: Longest line the listing reads from a file's head (header and title records).
_MAX_HEAD_LINE = 64 * 1024
TITLE_LENGTH = 80


def is_valid_session_id(session_id: object) -> TypeGuard[str]:
    """True when ``session_id`` can name a file in the store: ``[A-Za-z0-9_-]{1,128}``."""
    return isinstance(session_id, str) and _SESSION_ID.fullmatch(session_id) is not None


class Speaker(enum.StrEnum):
    USER = "user"
    AGENT = "agent"


class RecordKind(enum.StrEnum):
    HEADER = "header"
    TITLE = "title"
    USER = "user"
    AGENT = "agent"


@dataclass(frozen=True, slots=True)
class Message:
    """One history entry: who said it and the text."""

    speaker: Speaker
    text: str


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What ``session/list`` shows about one stored session."""

    session_id: str
    cwd: str
    title: str | None
    updated_ns: int  # file mtime, nanoseconds since the epoch

    @property
    def updated_at(self) -> str:
        """``updated_ns`` as ISO 8601 UTC with milliseconds, e.g. ``2026-08-01T10:00:00.000Z``."""
        moment = datetime.fromtimestamp(self.updated_ns / 1e9, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class StoredSession:
    info: SessionInfo
    history: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Lease:
    """One instance's claim on a session: the token it wrote to the session's lease file."""

    session_id: str
    token: str


class SessionStore:
    """The folder of session files. Invalid session ids are never looked up on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, root: Path) -> SessionStore:
        """Use ``root`` as the store, creating it if missing.

        Raises:
            ConfigError: ``root`` cannot be created or is not a writable directory.
        """
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--store {root}: {exc.strerror or exc}") from None
        if not root.is_dir():
            raise ConfigError(f"--store {root}: not a directory")
        if not os.access(root, os.W_OK | os.X_OK):
            raise ConfigError(f"--store {root}: directory is not writable")
        return cls(root)

    def path(self, session_id: str) -> Path:
        if not is_valid_session_id(session_id):
            raise ValueError(f"not a valid session id: {session_id!r}")
        return self.root / f"{session_id}{SUFFIX}"

    def lease_path(self, session_id: str) -> Path:
        return self.path(session_id).with_suffix(LEASE_SUFFIX)

    def create(self, session_id: str, cwd: str, created_at: datetime) -> Lease:
        """Create the session's file with its header record, and take the session.

        Raises:
            FileExistsError: a session with this id is already stored.
        """
        header = {
            "kind": RecordKind.HEADER,
            "sessionId": session_id,
            "cwd": cwd,
            "createdAt": created_at.isoformat(),
        }
        fd = os.open(
            self.path(session_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
        )
        try:
            _write_line(fd, header)
            return self._take_locked(fd, session_id)
        finally:
            os.close(fd)

    def take(self, session_id: str) -> Lease | None:
        """Take the session from whichever instance held it (None when it is not stored).

        Every later append under an older lease raises :class:`SessionMoved`.
        """
        if not is_valid_session_id(session_id):
            return None
        try:
            fd = os.open(self.path(session_id), os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            return None
        try:
            return self._take_locked(fd, session_id)
        finally:
            os.close(fd)

    def _take_locked(self, fd: int, session_id: str) -> Lease:
        lease = Lease(session_id, uuid.uuid4().hex)
        fcntl.flock(fd, fcntl.LOCK_EX)
        staged = self.root / f".{session_id}.{lease.token}{LEASE_SUFFIX}"
        try:
            staged.write_text(lease.token)
            os.replace(staged, self.lease_path(session_id))
        finally:
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
        return lease

    def holds(self, lease: Lease) -> bool:
        """True while ``lease`` is the session's current lease. No side effects."""
        try:
            return self.lease_path(lease.session_id).read_text() == lease.token
        except FileNotFoundError:
            return False

    def append_message(self, lease: Lease, message: Message) -> None:
        """Append one history record.

        Raises:
            SessionMoved: another instance took the session since ``lease``.
        """
        self._append(lease, {"kind": message.speaker.value, "text": message.text})

    def set_title(self, lease: Lease, title: str) -> None:
        """Record the session's title. Listing reads only a file's first two records, so
        set it before the first message (later titles still show in :meth:`load`).

        Raises:
            SessionMoved: another instance took the session since ``lease``.
        """
        self._append(lease, {"kind": RecordKind.TITLE, "title": title[:TITLE_LENGTH]})

    def epoch_path(self, session_id: str) -> Path:
        return self.path(session_id).with_suffix(EPOCH_SUFFIX)

    def epoch(self, session_id: str) -> int:
        """The session's epoch (0 when none was ever kept, or the file is unreadable)."""
        try:
            text = self.epoch_path(session_id).read_text()
        except (FileNotFoundError, ValueError):
            return 0
        return int(text) if text.isdigit() else 0

    def set_epoch(self, lease: Lease, epoch: int) -> None:
        """Keep ``epoch`` as the session's (while ``lease`` is its lease: an instance the
        session was taken from keeps nothing).

        Raises:
            SessionMoved: another instance took the session since ``lease``.
        """
        session_id = lease.session_id
        if not self.holds(lease):
            raise SessionMoved(session_id)
        staged = self.root / f".{session_id}.{lease.token}{EPOCH_SUFFIX}"
        try:
            staged.write_text(str(epoch))
            os.replace(staged, self.epoch_path(session_id))
        finally:
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()

    def exists(self, session_id: str) -> bool:
        """True when the session is stored with a readable header (so it can be loaded)."""
        return self.info(session_id) is not None

    def load(self, session_id: str) -> StoredSession | None:
        """The whole session, or None when it is not stored (or its header is unreadable)."""
        if not is_valid_session_id(session_id):
            return None
        try:
            with self.path(session_id).open("rb") as file:
                updated_ns = os.fstat(file.fileno()).st_mtime_ns
                records = list(_records(file))
        except FileNotFoundError:
            return None
        return _stored_session(session_id, records, updated_ns)

    def info(self, session_id: str) -> SessionInfo | None:
        """The session's list entry, reading only the head of its file."""
        if not is_valid_session_id(session_id):
            return None
        try:
            with self.path(session_id).open("rb") as file:
                updated_ns = os.fstat(file.fileno()).st_mtime_ns
                head = [_decode(file.readline(_MAX_HEAD_LINE)) for _ in range(2)]
        except FileNotFoundError:
            return None
        records = [record for record in head if record is not None]
        return _session_info(session_id, records, updated_ns)

    def list_sessions(self) -> list[SessionInfo]:
        """Every readable session in the store, in no particular order."""
        infos = (self.info(session_id) for session_id in self._session_ids())
        return [info for info in infos if info is not None]

    def _session_ids(self) -> Iterator[str]:
        with os.scandir(self.root) as entries:
            for entry in entries:
                stem = entry.name.removesuffix(SUFFIX)
                if entry.name.endswith(SUFFIX) and is_valid_session_id(stem):
                    yield stem

    def _append(self, lease: Lease, record: dict[str, Any]) -> None:
        fd = os.open(self.path(lease.session_id), os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # no take can fall between the check and the write
            if not self.holds(lease):
                raise SessionMoved(lease.session_id)
            _write_line(fd, record, after_torn_line=_ends_torn(fd))
        finally:
            os.close(fd)


def _write_line(fd: int, record: dict[str, Any], *, after_torn_line: bool = False) -> None:
    """Append ``record`` as one line with a single ``write``.

    After a torn last line (a crash mid-write) the record starts on a fresh line, so it
    is not glued to the torn one and lost with it. Another process's write in progress
    can look torn too; that only costs a blank line, which readers skip.
    """
    data = dumps(record).encode() + b"\n"  # a prompt cut inside an emoji is stored too
    if after_torn_line:
        data = b"\n" + data
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(errno.EIO, f"short write to the session store ({written} of {len(data)})")


def _ends_torn(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def _records(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    for line in lines:
        record = _decode(line)
        if record is not None:
            yield record


def _decode(line: bytes) -> dict[str, Any] | None:
    """One record, or None for a blank, torn (no newline) or unreadable line."""
    if not line.endswith(b"\n") or not line.strip():
        return None
    try:
        record = loads(line)
    except ValueError:
        logger.warning("session store: skipping an unreadable record")
        return None
    return record if isinstance(record, dict) else None


def _session_info(
    session_id: str, records: list[dict[str, Any]], updated_ns: int
) -> SessionInfo | None:
    if not records or records[0].get("kind") != RecordKind.HEADER:
        return None
    cwd = records[0].get("cwd")
    if not isinstance(cwd, str):
        return None
    titles = [r["title"] for r in records if r.get("kind") == RecordKind.TITLE]
    title = titles[-1] if titles and isinstance(titles[-1], str) else None
    return SessionInfo(session_id, cwd, title, updated_ns)


def _stored_session(
    session_id: str, records: list[dict[str, Any]], updated_ns: int
) -> StoredSession | None:
    info = _session_info(session_id, records, updated_ns)
    if info is None:
        return None
    history = tuple(
        Message(Speaker(record["kind"]), record["text"])
        for record in records
        if record.get("kind") in (RecordKind.USER, RecordKind.AGENT)
        and isinstance(record.get("text"), str)
    )
    return StoredSession(info, history)
