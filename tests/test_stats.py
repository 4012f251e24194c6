import pytest

from evalkit.stats import mean, pct_delta, percentile


def test_percentile_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile(list(range(101)), 99) == pytest.approx(99)
    assert percentile([5], 90) == 5
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_mean_and_delta():
    assert mean([1, None, 3]) == 2
    assert mean([]) is None
    assert pct_delta(1372.12, 866.93) == pytest.approx(58.27, abs=0.01)  # the seed's +58 % TTFT tax
    assert pct_delta(11526.2, 12290.2) == pytest.approx(-6.216, abs=0.001)
    assert pct_delta(1, 0) is None and pct_delta(None, 1) is None
