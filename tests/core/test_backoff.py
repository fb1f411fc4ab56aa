"""The control link's reconnect pacing, sans-I/O (:mod:`router.core.reconnect`): a link
that is down keeps trying throughout the grace, however large its backoff cap."""

from __future__ import annotations

import pytest

from router.core.reconnect import TRIES_PER_GRACE, Backoff


@pytest.mark.parametrize(
    ("initial", "most", "grace", "first", "longest"),
    [
        (0.1, 5.0, 30.0, 0.1, 3.0),  # the defaults: the grace's pace is the tighter
        (0.1, 2.0, 60.0, 0.1, 2.0),  # a long grace: the operator's cap
        (0.5, 0.5, 1.5, 0.15, 0.15),  # a first pause above the grace's pace is capped too
    ],
)
def test_a_down_link_never_pauses_longer_than_the_grace_allows(
    initial: float, most: float, grace: float, first: float, longest: float
) -> None:
    backoff = Backoff.of(initial, most, grace)
    assert (backoff.first, backoff.longest) == pytest.approx((first, longest))


def test_the_backoff_doubles_to_its_cap_and_starts_over_once_reached() -> None:
    backoff = Backoff.of(0.1, 5.0, 30.0)
    pauses = [backoff.first]
    for _ in range(8):
        pauses.append(backoff.after(pauses[-1], reached=False))
    assert pauses == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0, 3.0, 3.0])
    assert backoff.after(3.0, reached=True) == 0.1


@pytest.mark.parametrize("grace", [0.6, 1.5, 30.0, 600.0])
def test_a_link_that_never_gets_through_tries_at_least_ten_times_per_grace(grace: float) -> None:
    backoff = Backoff.of(0.1, grace / 3, grace)  # the widest cap the configuration accepts
    pause, waited, tries = backoff.first, 0.0, 0
    while waited + pause <= grace:  # each pause at its longest: a jitter draw near 1
        waited += backoff.jittered(pause, 0.999999)
        tries += 1
        pause = backoff.after(pause, reached=False)
    assert tries >= TRIES_PER_GRACE


def test_jitter_only_shortens_a_pause() -> None:
    assert [Backoff.jittered(2.0, draw) for draw in (0.0, 0.25, 0.999)] == pytest.approx(
        [0.0, 0.5, 1.998]
    )
