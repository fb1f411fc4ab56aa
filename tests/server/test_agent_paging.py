"""``session/list`` paging of the reference agent, pure."""

from __future__ import annotations

import base64

import pytest

from router.agent.paging import paginate
from router.agent.store import SessionInfo
from router.protocol.errors import InvalidParams


def info(session_id: str, updated_ns: int, cwd: str = "/w") -> SessionInfo:
    return SessionInfo(session_id, cwd, None, updated_ns)


SESSIONS = [info(f"s{n}", n // 2, "/w" if n % 3 else "/other") for n in range(10)]


def all_pages(cwd: str | None, page_size: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = paginate(SESSIONS, cwd=cwd, cursor=cursor, page_size=page_size)
        pages.append([s.session_id for s in page.sessions])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def test_newest_first_ties_by_id() -> None:
    page = paginate(SESSIONS, cwd=None, cursor=None, page_size=50)
    assert [s.session_id for s in page.sessions] == [
        "s8", "s9", "s6", "s7", "s4", "s5", "s2", "s3", "s0", "s1"
    ]  # fmt: skip
    assert page.next_cursor is None
    assert "nextCursor" not in page.to_result()


@pytest.mark.parametrize("page_size", [1, 2, 3, 4, 10])
def test_pages_cover_everything_once(page_size: int) -> None:
    pages = all_pages(None, page_size)
    flat = [s for p in pages for s in p]
    assert flat == [
        s.session_id for s in paginate(SESSIONS, cwd=None, cursor=None, page_size=99).sessions
    ]
    assert all(len(p) == page_size for p in pages[:-1])
    assert 0 < len(pages[-1]) <= page_size


def test_cwd_filter_is_exact() -> None:
    pages = all_pages("/other", 2)
    assert pages == [["s9", "s6"], ["s3", "s0"]]
    assert all_pages("/other/", 2) == [[]]


def test_result_shape() -> None:
    sessions = [SessionInfo("sess_t", "/w", "Title", 1_700_000_000_000_000_000)]
    page = paginate(sessions, cwd=None, cursor=None, page_size=1)
    assert page.to_result() == {
        "sessions": [
            {
                "sessionId": "sess_t",
                "cwd": "/w",
                "title": "Title",
                "updatedAt": "2023-11-14T22:13:20.000Z",
            }
        ]
    }


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "not base64 !",
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'{"u": "1", "s": "s1"}').decode(),
        base64.urlsafe_b64encode(b'{"u": 1, "s": "../x"}').decode(),
        base64.urlsafe_b64encode(b'{"u": true, "s": "s1"}').decode(),
    ],
)
def test_invalid_cursor(cursor: str) -> None:
    with pytest.raises(InvalidParams, match="invalid cursor"):
        paginate(SESSIONS, cwd=None, cursor=cursor, page_size=2)
