"""Helpers of the sans-I/O tests (tests/core) that other tests use too.

* :data:`IDS`: any text a client may send where an id goes (a Hypothesis strategy).
"""

from __future__ import annotations

from hypothesis import strategies as st

from router.core import hinted_ids
from router.core.hinted_ids import _check

#: any text: every code point, lone surrogates too (JSON's \ud800 escapes make them)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
#: and long ones, made of the characters the readers split on
LONG_TEXT = st.builds(
    lambda unit, times, tail: unit * times + tail,
    st.sampled_from(["9", "0", "@", ".", "é", "\ud83d", "A"]),
    st.integers(0, 6000),
    ANY_TEXT,
)
#: shaped like a hinted id: any agent id and home, with the check they need (no secret
#: is needed for one)
HINTED_SHAPE = st.builds(lambda s, h: f"{s}@{h}.{_check(s, h)}", ANY_TEXT, ANY_TEXT)
#: shaped like a sealed id: any text, a dot, as many characters as a MAC has
SEALED_SHAPE = st.builds(
    lambda s, m: f"{s}.{m}",
    ANY_TEXT,
    st.text(st.characters(exclude_categories=()), min_size=22, max_size=22),
)
IDS = ANY_TEXT | LONG_TEXT | HINTED_SHAPE | SEALED_SHAPE


def forged(session_id: str, home: str) -> str:
    """A hinted id whose home is any text, with the check it needs (no secret is)."""
    return f"{session_id}@{home}.{hinted_ids._check(session_id, home)}"
