"""router.core.placement: weighted rendezvous ranking, and spreading new sessions."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from router.core import placement
from router.core.placement import Node, Ranking, Spread
from router.protocol.ids import BackendId, SessionId

KEYS = [f"sess-{n}" for n in range(4000)]
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}


def _nodes(weights: dict[str, float]) -> list[Node]:
    return [Node(node_id, weight) for node_id, weight in weights.items()]


def _owners(ranking: Ranking, keys: list[str]) -> dict[str, str]:
    return {key: ranking.rank(key)[0] for key in keys}


def test_rank_lists_every_node_once() -> None:
    ranking = Ranking(_nodes(WEIGHTS))
    for key in KEYS[:50]:
        assert sorted(ranking.rank(key)) == sorted(WEIGHTS)


def test_ranking_is_the_same_across_instances_and_node_orders() -> None:
    nodes = _nodes(WEIGHTS)
    first = Ranking(nodes)
    again = Ranking(nodes)
    shuffled = Ranking(reversed(nodes))
    rotated = Ranking(nodes[2:] + nodes[:2])
    for key in KEYS[:500]:
        expected = first.rank(key)
        assert again.rank(key) == expected
        assert shuffled.rank(key) == expected
        assert rotated.rank(key) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("sess-0", ["b", "c", "d", "a"]),
        ("sess-1", ["d", "c", "b", "a"]),
        ("0198f0c2-7e1b-7c3e-9a51-3b1f2f0f4a1d", ["b", "d", "a", "c"]),
    ],
)
def test_ranking_is_pinned_across_processes_and_releases(key: str, expected: list[str]) -> None:
    # hash() is salted per process; replicas must agree, so the ranking is pinned here.
    assert Ranking(_nodes(WEIGHTS)).rank(key) == expected
    assert placement._hash64("sess-0") == 5385251522094302368


def test_weights_are_respected() -> None:
    ranking = Ranking(_nodes(WEIGHTS))
    keys = [f"key-{n}" for n in range(20_000)]
    counts = Counter(ranking.rank(key)[0] for key in keys)
    total = sum(WEIGHTS.values())
    for node_id, weight in WEIGHTS.items():
        assert counts[node_id] / len(keys) == pytest.approx(weight / total, abs=0.02)


def test_equal_weights_spread_evenly() -> None:
    ranking = Ranking(Node(f"n{i}") for i in range(5))
    counts = Counter(ranking.rank(key)[0] for key in KEYS)
    for node_id in (f"n{i}" for i in range(5)):
        assert counts[node_id] / len(KEYS) == pytest.approx(0.2, abs=0.03)


def test_removing_a_node_moves_only_its_keys() -> None:
    before = _owners(Ranking(_nodes(WEIGHTS)), KEYS)
    after = _owners(Ranking(_nodes({k: w for k, w in WEIGHTS.items() if k != "c"})), KEYS)
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "c"}
    assert moved  # c owned something


def test_adding_a_node_moves_keys_only_to_it() -> None:
    before = _owners(Ranking(_nodes(WEIGHTS)), KEYS)
    after = _owners(Ranking(_nodes(WEIGHTS | {"e": 2.0})), KEYS)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved
    assert all(after[key] == "e" for key in moved)
    assert {key for key in KEYS if after[key] == "e"} == set(moved)


@pytest.mark.parametrize("new_weight", [0.5, 8.0])
def test_changing_one_weight_moves_keys_only_to_or_from_that_node(new_weight: float) -> None:
    before = _owners(Ranking(_nodes(WEIGHTS)), KEYS)
    after = _owners(Ranking(_nodes(WEIGHTS | {"b": new_weight})), KEYS)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved
    for key in moved:
        assert "b" in (before[key], after[key])
    if new_weight < WEIGHTS["b"]:
        assert all(before[key] == "b" for key in moved)
    else:
        assert all(after[key] == "b" for key in moved)


def test_the_order_of_the_others_does_not_depend_on_a_missing_node() -> None:
    full = Ranking(_nodes(WEIGHTS))
    without_a = Ranking(_nodes({k: w for k, w in WEIGHTS.items() if k != "a"}))
    for key in KEYS[:300]:
        assert [n for n in full.rank(key) if n != "a"] == without_a.rank(key)


def test_empty_ranking() -> None:
    ranking = Ranking([])
    assert ranking.rank("s") == []


def test_nodes_are_kept_in_the_given_order() -> None:
    nodes = _nodes(WEIGHTS)
    assert Ranking(nodes).nodes == tuple(nodes)


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        Ranking([Node("a"), Node("b"), Node("a", 2.0)])


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf])
def test_weights_must_be_positive_and_finite(weight: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        Ranking([Node("a"), Node("b", weight)])


def _unmix(value: int) -> int:
    """The inverse of placement._mix (splitmix64's finaliser is a bijection)."""

    def unshift(x: int, shift: int) -> int:
        result = x
        for _ in range(64 // shift + 1):
            result = x ^ (result >> shift)
        return result & placement._M64

    modulus = 1 << 64
    value = unshift(value, 31)
    value = (value * pow(0x94D049BB133111EB, -1, modulus)) % modulus
    value = unshift(value, 27)
    value = (value * pow(0xBF58476D1CE4E5B9, -1, modulus)) % modulus
    value = unshift(value, 31)
    return (value * pow(0x9E3779B97F4A7C15, -1, modulus)) % modulus


@pytest.mark.parametrize("mixed", [0, 1, 2**63, placement._M64 - 2000, placement._M64 - 5])
def test_scores_are_finite_over_the_whole_hash_range(mixed: int) -> None:
    # The top ~1000 hash values used to round U up to exactly 1.0: ln(1) = 0, and the
    # score divided by zero (for those sessions, on every replica, forever).
    seed = placement._hash64("node")
    key_hash = _unmix(mixed) ^ seed
    assert placement._mix(key_hash ^ seed) == mixed
    score = placement._score(key_hash, seed, 1.0)
    assert math.isfinite(score)
    assert score > 0


def test_scores_grow_with_the_mixed_hash() -> None:
    seed = placement._hash64("node")
    scores = [
        placement._score(_unmix(mixed) ^ seed, seed, 1.0)
        for mixed in (0, 2**32, 2**62, 2**63, placement._M64 - 2**20, placement._M64)
    ]
    assert scores == sorted(scores)


# -- Spread: new sessions ------------------------------------------------------------------------

EQUAL = [Node(BackendId(n)) for n in ("a", "b", "c")]
NOBODY: dict[BackendId, int] = {}


def test_one_session_clients_in_a_row_spread_evenly() -> None:
    """Each client leaves before the next comes (nothing stays attached): on main all 12
    went to one backend."""
    spread = Spread(300.0, salt="replica-1")
    placed = [spread.place(EQUAL, NOBODY, now=float(t)) for t in range(12)]
    assert Counter(placed) == {"a": 4, "b": 4, "c": 4}
    assert all(len(set(placed[i : i + 3])) == 3 for i in range(0, 12, 3))


def test_weights_share_new_sessions() -> None:
    spread = Spread(300.0)
    nodes = [Node(BackendId("light"), 1.0), Node(BackendId("heavy"), 3.0)]
    assert Counter(spread.place(nodes, NOBODY, now=0.0) for _ in range(40)) == {
        "light": 10,
        "heavy": 30,
    }


def test_attached_sessions_count_too() -> None:
    spread = Spread(300.0)
    attached = {BackendId("a"): 3}
    placed = [spread.place(EQUAL, attached, now=0.0) for _ in range(6)]
    assert Counter(placed) == {"b": 3, "c": 3}  # until they carry as much as a's three


def test_placements_fade_with_the_half_life() -> None:
    spread = Spread(10.0)
    only_a = EQUAL[:1]
    for _ in range(4):
        assert spread.place(only_a, NOBODY, now=0.0) == "a"
    assert spread.recent(BackendId("a"), 0.0) == 4.0
    assert spread.recent(BackendId("a"), 10.0) == pytest.approx(2.0)
    assert spread.recent(BackendId("a"), 30.0) == pytest.approx(0.5)
    assert spread.recent(BackendId("b"), 30.0) == 0.0
    # right after, "a" carries its four; much later it is a peer again
    assert spread.place(EQUAL, NOBODY, now=0.0) != "a"
    later = [spread.place(EQUAL, NOBODY, now=1000.0 + t) for t in range(3)]
    assert set(later) == {"a", "b", "c"}


def test_ties_break_by_salt_so_replicas_do_not_pile_up() -> None:
    firsts = {Spread(300.0, salt=f"replica-{n}").place(EQUAL, NOBODY, now=0.0) for n in range(30)}
    assert firsts == {"a", "b", "c"}
    again = [Spread(300.0, salt="same").place(EQUAL, NOBODY, now=0.0) for _ in range(3)]
    assert len(set(again)) == 1  # the same inputs, the same choice


def test_no_candidate_places_nothing() -> None:
    assert Spread(300.0).place([], NOBODY, now=0.0) is None


@pytest.mark.parametrize("half_life", [0.0, -1.0, math.inf, math.nan])
def test_half_life_must_be_positive_and_finite(half_life: float) -> None:
    with pytest.raises(ValueError, match="half-life"):
        Spread(half_life)


# -- each session counts once ---------------------------------------------------------------------

S = [SessionId(f"s{n}") for n in range(12)]


def test_a_session_counts_once_however_often_it_was_placed_resumed_or_attached() -> None:
    # created on a, its client leaves, another client resumes it, and leaves: one session.
    # On the old rule it weighed three on a, and 12 one-session clients landed 5/5/2.
    spread = Spread(300.0, salt="x")
    a = BackendId("a")
    attached: dict[BackendId, int] = {}
    assert spread.place([Node(a)], attached, now=0.0) == a
    assert spread.recent(a, 0.0) == 1.0  # the placement, until its session attaches
    spread.created(a, now=0.0)
    attached = {a: 1}
    spread.attached(S[0], now=0.0)
    assert attached[a] + spread.recent(a, 0.0) == 1.0
    attached = {}
    spread.detached(S[0], a, now=1.0)  # the agent keeps it: it fades from now
    assert spread.recent(a, 1.0) == 1.0
    spread.attached(S[0], now=2.0)  # resumed elsewhere on this replica... or here
    attached = {a: 1}
    assert attached[a] + spread.recent(a, 2.0) == pytest.approx(1.0)
    spread.detached(S[0], a, now=3.0)
    assert spread.recent(a, 3.0) == pytest.approx(1.0)
    spread.released(S[0], now=4.0)  # closed: it weighs nothing
    assert spread.recent(a, 4.0) == pytest.approx(0.0, abs=1e-9)


def test_twelve_one_session_clients_after_earlier_traffic_spread_evenly() -> None:
    spread = Spread(300.0, salt="replica-1")
    earlier = spread.place(EQUAL, NOBODY, now=0.0)
    assert earlier is not None
    spread.created(earlier, now=0.0)
    spread.attached(S[0], now=0.0)
    spread.detached(S[0], earlier, now=1.0)
    spread.attached(S[0], now=2.0)  # resumed by another client
    spread.detached(S[0], earlier, now=3.0)
    placed: list[BackendId] = []
    for n in range(1, 13):
        backend = spread.place(EQUAL, NOBODY, now=10.0 + n)
        assert backend is not None
        spread.created(backend, now=10.0 + n)
        spread.attached(S[n % 12], now=10.0 + n)
        spread.detached(S[n % 12], backend, now=10.5 + n)
        placed.append(backend)
    # the earlier session counts once: 4/4/4 give or take that one
    assert all(3 <= c <= 5 for c in Counter(placed).values()), Counter(placed)
    assert Counter(placed)[earlier] <= 4


def test_let_go_sessions_are_bounded() -> None:
    spread = Spread(300.0, max_sessions=2)
    a = BackendId("a")
    for n in range(4):
        spread.detached(S[n], a, now=0.0)
    assert spread.recent(a, 0.0) == pytest.approx(2.0)


def test_a_backend_that_left_carries_nothing() -> None:
    spread = Spread(300.0)
    a = BackendId("a")
    spread.detached(S[0], a, now=0.0)
    spread.forget_backend(a)
    assert spread.recent(a, 0.0) == 0.0
    spread.attached(S[0], now=1.0)  # nothing left to take back
    assert spread.recent(a, 1.0) == 0.0
