import math

import numpy as np
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


def _skewed(n: int, seed: int) -> list[float]:
    import random

    rng = random.Random(seed)
    return [rng.lognormvariate(0.0, 0.8) - 1.0 for _ in range(n)]


@pytest.mark.parametrize("n", [8, 20, 60])
def test_a_bootstrap_t_interval_excludes_exactly_what_its_test_rejects(n):
    import numpy as np

    from evalkit.stats import BootstrapT

    t = BootstrapT(np.asarray(_skewed(n, n)))
    lo, hi = t.interval(0.05)
    assert t.p(lo) > 0.05
    assert t.p(lo - 1e-9) <= 0.05
    assert t.p(hi) > 0.05
    assert t.p(hi + 1e-9) <= 0.05


@pytest.mark.parametrize("d", [-0.5, 0.0, 0.3, 1.0])
def test_the_robust_test_claims_only_what_all_its_tests_claim(d):
    from evalkit.stats import robust_mean

    t = robust_mean(_skewed(24, 1))
    assert t.p(d) == max(t.flip.p(d), t.boot.p(d), t.hall.p(d))


def test_the_robust_interval_is_the_hull_of_all():
    from evalkit.stats import robust_mean

    t = robust_mean(_skewed(24, 2))
    ivs, r = [x.interval(0.05) for x in (t.flip, t.boot, t.hall)], t.interval(0.05)
    assert r == (min(iv[0] for iv in ivs), max(iv[1] for iv in ivs))


@pytest.mark.parametrize("n", [8, 20, 60])
def test_a_skewness_corrected_interval_excludes_exactly_what_its_test_rejects(n):
    import numpy as np

    from evalkit.stats import BootstrapT

    t = BootstrapT(np.asarray(_skewed(n, n)), skew_corrected=True)
    lo, hi = t.interval(0.05)
    assert (t.p(lo) > 0.05, t.p(lo - 1e-9) <= 0.05, t.p(hi) > 0.05, t.p(hi + 1e-9) <= 0.05) == (True,) * 4


@pytest.mark.parametrize("t", [0.0, 1.5, -2.0])
def test_hall_s_transformation_inverts(t):
    import numpy as np

    from evalkit.stats.robust import _hall, _hall_inverse

    assert float(_hall_inverse(_hall(np.asarray(t), 0.4), 0.4)) == pytest.approx(t)


def test_a_ratio_s_bootstrap_estimate_is_the_ratio_of_means_in_percent():
    from evalkit.stats import robust_ratio

    t = robust_ratio([110.0, 220.0, 330.0], [100.0, 200.0, 300.0])
    assert t.estimate == pytest.approx(10.0)


def test_the_stratified_estimate_weights_each_stratum_by_its_share():
    from evalkit.stats import robust_mean

    # stratum a: mean 0 and weight 0.9; b: mean -1 and weight 0.1
    t = robust_mean([0.0, 0.0, 0.0, -1.0, -1.0, 0.0], strata=list("aaabbb"), weights={"a": 90.0, "b": 10.0})
    assert t.estimate == pytest.approx(0.1 * (-2 / 3))


def test_a_stratified_se_is_the_weighted_sum_of_the_strata_variances():
    import numpy as np

    from evalkit.stats import BootstrapT

    d = np.asarray([1.0, 2.0, 3.0, 10.0, 20.0])
    t = BootstrapT(d, strata=list("aaabb"), weights={"a": 3.0, "b": 1.0})
    want = math.sqrt(0.75 ** 2 * 1.0 / 3 + 0.25 ** 2 * 50.0 / 2)
    assert t.se == pytest.approx(want)


def test_one_pair_gives_no_bootstrap_interval():
    import numpy as np

    from evalkit.stats import BootstrapT

    assert BootstrapT(np.asarray([1.0])).interval(0.05) is None


def test_a_bootstrap_reads_the_multiset_not_its_order_or_grouping():
    """A query gives quality under load's differences as distinct values and counts, the known
    answer computes them as a list: the same multiset, the same interval, in any order."""
    import random
    from collections import Counter

    from evalkit.stats import bootstrap_ci

    rng = random.Random(3)
    xs = [rng.choice([-1.0, 0.0, 0.0, 0.0, 0.5, 1.0]) for _ in range(5000)]
    got = Counter(xs)
    shuffled = rng.sample(xs, len(xs))
    assert bootstrap_ci(shuffled) == bootstrap_ci(xs)
    assert bootstrap_ci(list(got), counts=list(got.values())) == bootstrap_ci(xs)


@pytest.mark.parametrize(("n", "probs"), [
    (200, (0.03, 0.94, 0.03)),  # zero-inflated pass/fail flips, no shift
    (200, (0.01, 0.94, 0.05)),  # skewed: a few more gains than losses
    (60, (0.1, 0.8, 0.1)),  # small
    (1000, (0.002, 0.99, 0.008)),  # almost every pair the same
])
def test_a_bootstrap_of_few_distinct_values_covers_the_mean_at_its_stated_rate(n, probs):
    """Few distinct values (pass/fail differences) take the multinomial draw: the 95 % interval
    holds the true mean about 95 % of the time, as the draw of every value with replacement does."""
    import random

    from evalkit.stats import bootstrap_ci

    rng, mu, trials, held = random.Random(7), probs[2] - probs[0], 400, 0
    for _ in range(trials):
        ci = bootstrap_ci(rng.choices([-1.0, 0.0, 1.0], probs, k=n), n_resamples=400,
                          bootstrap_seed=rng.randrange(10**6))
        held += ci is not None and ci[0] <= mu <= ci[1]
    assert 0.90 <= held / trials <= 0.99


@pytest.mark.parametrize("n", [15, 21, 2001])  # past EXACT_UP_TO; not a multiple of 8; a block a pattern
def test_random_subsets_kept_as_bits_sum_to_their_sizes(n):
    from evalkit.stats.signflip import _subset_sums

    sums, _, _ = _subset_sums(np.ones((n, 1)), 3000, 0)  # a column of ones sums to each subset's size
    assert np.array_equal(sums[0], sums[1])
