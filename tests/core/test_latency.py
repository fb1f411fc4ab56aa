import pytest

from router.core.latency import smoothed


def test_the_first_sample_is_taken_as_it_is() -> None:
    assert smoothed(None, 0.5) == 0.5


def test_a_sample_moves_the_average_by_its_weight() -> None:
    assert smoothed(1.0, 2.0, weight=0.25) == pytest.approx(1.25)


def test_one_slow_sample_does_not_swamp_the_average() -> None:
    average = None
    for sample in [0.001] * 20 + [1.0]:
        average = smoothed(average, sample)
    assert average == pytest.approx(0.001 + 0.2 * 0.999)


@pytest.mark.parametrize("weight", [0.0, -0.1, 1.5])
def test_a_weight_outside_0_1_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        smoothed(1.0, 2.0, weight=weight)
