import math

import pytest

from evalkit.stats import mean, pct_delta, percentile
from evalkit.stats.describe import LARGE


def test_percentile_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
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
    assert pct_delta(1, 0) is None
    assert pct_delta(None, 1) is None


def test_min_detectable_difference_has_80_percent_power():
    """A true mean difference equal to the minimum detectable one is detected (the bootstrap CI
    excludes 0) about 80 % of the time; a zero difference about 5 % of the time."""
    import random

    from evalkit.stats import bootstrap_ci, min_detectable

    rng = random.Random(1)
    base = [rng.gauss(0, 0.05) for _ in range(24)]
    mdd = min_detectable(base, n_resamples=500)
    assert mdd == pytest.approx(2.8 * 0.05 / 24 ** 0.5, rel=0.35)
    hits = zero_hits = 0
    trials = 150
    for _ in range(trials):
        sample = [rng.gauss(mdd, 0.05) for _ in range(24)]
        lo, _ = bootstrap_ci(sample, n_resamples=400, bootstrap_seed=rng.randrange(10**6))
        hits += lo > 0
        null = [rng.gauss(0, 0.05) for _ in range(24)]
        lo0, hi0 = bootstrap_ci(null, n_resamples=400, bootstrap_seed=rng.randrange(10**6))
        zero_hits += lo0 > 0 or hi0 < 0
    assert 0.6 <= hits / trials <= 0.95
    assert zero_hits / trials <= 0.15


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 99.9, 100])
def test_a_large_percentile_is_the_small_rule_to_the_ulp(q):
    import random

    rng = random.Random(q)
    xs = [rng.lognormvariate(3, 1) if i % 11 else None for i in range(LARGE + 37)]
    small = sorted(x for x in xs if x is not None)
    pos = (len(small) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    assert percentile(xs, q) == pytest.approx(small[lo] + (small[hi] - small[lo]) * (pos - lo), rel=1e-15, abs=0)
