"""``session/list`` paging, pure: filter by cwd, newest first, keyset cursors.

A cursor is the opaque (base64url JSON) sort key of the last session on the previous
page, so a page boundary stays put when sessions are created or updated meanwhile.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from router.agent.store import SessionInfo, is_valid_session_id
from router.protocol.errors import InvalidParams

DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Page:
    sessions: tuple[SessionInfo, ...]
    next_cursor: str | None

    def to_result(self) -> dict[str, Any]:
        """The ``session/list`` result; ``nextCursor`` is absent on the last page."""
        result: dict[str, Any] = {"sessions": [_entry(info) for info in self.sessions]}
        if self.next_cursor is not None:
            result["nextCursor"] = self.next_cursor
        return result


def paginate(
    sessions: Iterable[SessionInfo], *, cwd: str | None, cursor: str | None, page_size: int
) -> Page:
    """One page of ``sessions`` (only those in ``cwd`` when given), newest first.

    Raises:
        InvalidParams: ``cursor`` is not one this module issued.
    """
    after = _decode_cursor(cursor) if cursor is not None else None
    ordered = sorted((s for s in sessions if cwd is None or s.cwd == cwd), key=_sort_key)
    if after is not None:
        ordered = [s for s in ordered if _sort_key(s) > after]
    page = tuple(ordered[:page_size])
    more = len(ordered) > page_size
    return Page(page, _encode_cursor(_sort_key(page[-1])) if more else None)


def _sort_key(info: SessionInfo) -> tuple[int, str]:
    return (-info.updated_ns, info.session_id)


def _entry(info: SessionInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {"sessionId": info.session_id, "cwd": info.cwd}
    if info.title is not None:
        entry["title"] = info.title
    entry["updatedAt"] = info.updated_at
    return entry


def _encode_cursor(key: tuple[int, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"u": -key[0], "s": key[1]})).decode()


def _decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        obj = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError:  # binascii.Error and orjson.JSONDecodeError included
        obj = None
    updated = obj.get("u") if isinstance(obj, dict) else None
    session_id = obj.get("s") if isinstance(obj, dict) else None
    if type(updated) is not int or not is_valid_session_id(session_id):
        raise InvalidParams(f"invalid cursor {cursor!r}: pass a nextCursor from session/list")
    return (-updated, session_id)
