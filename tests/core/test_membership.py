"""router.core.membership: what a new backend list changes, and which other settings
need a restart."""

from __future__ import annotations

from router.core.membership import Member, MembershipChange, diff, flatten, needs_restart
from router.protocol.ids import BackendId


def member(backend: str, weight: float = 1.0, url: str | None = None) -> Member:
    return Member(BackendId(backend), weight, (url or f"ws://{backend}:9001/acp",))


def test_the_same_list_changes_nothing() -> None:
    pool = [member("a"), member("b", 2.0)]
    change = diff(pool, list(reversed(pool)))
    assert change.empty
    assert change.summary() == "no backend changed"


def test_added_removed_reweighted_and_replaced_are_told_apart() -> None:
    old = [member("a"), member("b"), member("c"), member("d")]
    new = [member("b", 3.0), member("c", url="ws://elsewhere:1/acp"), member("d"), member("e")]
    change = diff(old, new)
    assert change == MembershipChange(
        added=(member("e"),),
        removed=(BackendId("a"),),
        reweighted=(member("b", 3.0),),
        replaced=(member("c", url="ws://elsewhere:1/acp"),),
    )
    assert not change.empty
    assert change.summary() == "added e; removed a; reweighted b (weight 3); replaced c"


def test_a_backend_moved_and_reweighted_at_once_is_replaced() -> None:
    change = diff([member("a")], [member("a", 2.0, url="ws://new:1/acp")])
    assert change.replaced == (member("a", 2.0, url="ws://new:1/acp"),)
    assert change.reweighted == ()


def test_flatten_keeps_lists_and_empty_tables_whole() -> None:
    assert flatten({"router": {"listen": "x", "origins": ["a"]}, "auth": None, "probe": {}}) == {
        "router.listen": "x",
        "router.origins": ["a"],
        "auth": None,
        "probe": {},
    }


def test_needs_restart_names_changed_keys_outside_the_live_ones() -> None:
    old = {"router": {"listen": "a:1", "unknown_policy": "fail_closed"}, "backends": [1]}
    new = {"router": {"listen": "a:2", "unknown_policy": "place_anyway"}, "backends": [2]}
    assert needs_restart(old, new, ("backends", "router.unknown_policy")) == ("router.listen",)
    assert needs_restart(old, old, ()) == ()


def test_a_section_that_appears_is_named_once() -> None:
    old = {"auth": None}
    new = {"auth": {"tokens": ["t"], "bind_sessions": False, "session_secret": None}}
    assert needs_restart(old, new, ("auth.tokens",)) == ("auth",)
    assert needs_restart(new, old, ("auth.tokens",)) == ("auth",)
