"""The status page's words (router/server/operator/admin.html): what its counts count
(tests/e2e/test_admin_page.py loads it in a browser)."""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "router" / "server" / "operator" / "admin.html"


def test_the_page_says_what_its_session_count_counts() -> None:
    """The backends' session column is the sessions attached through this replica, which
    an agent's own report can exceed (a session stays active after its client leaves): the
    page names it so, instead of a bare "sessions here" that contradicts the agents."""
    page = PAGE.read_text()
    assert "<th>sessions here</th>" not in page
    assert "attached via this router</th>" in page
    assert "acp-router status URL SESSION_ID" in page
