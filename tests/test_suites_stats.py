"""Known answers for the accuracy statistics (McNemar against hand-computed binomial tails, Connor's
sample size, recovery and its interval's coverage on clustered data) and the log-likelihood
choice math (acc, acc_norm by characters, by bytes, by tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from evalkit.stats.accuracy import mcnemar_exact, min_detectable_difference, recovery, t_quantile
from evalkit.suites.choice import OptionScore, accuracy, choose, context, continuations
from evalkit.suites.items import ChoiceItem

# --- McNemar ---


@pytest.mark.parametrize(("lost", "gained", "p"), [
    (5, 0, 2 / 32),                  # 2 * P(X <= 0), n = 5
    (10, 2, 2 * 79 / 4096),          # 2 * (1 + 12 + 66) / 2^12
    (0, 7, 2 / 128),
    (6, 4, 2 * 386 / 1024),          # 2 * (1 + 10 + 45 + 120 + 210) / 2^10
    (3, 3, 1.0),                     # the tail doubled passes 1: capped
    (0, 0, 1.0),                     # no discordant pair
])
def test_mcnemar_matches_the_hand_computed_binomial(lost, gained, p):
    assert mcnemar_exact(lost, gained) == pytest.approx(p, rel=1e-12)


def test_mcnemar_is_symmetric():
    assert mcnemar_exact(9, 3) == mcnemar_exact(3, 9)


def test_mcnemar_in_log_space_agrees_with_the_exact_sum_at_the_switch():
    from evalkit.stats import accuracy as acc

    exact = mcnemar_exact(560, 440)  # 1000 pairs: exact integers
    acc_up, acc.EXACT_UP_TO = acc.EXACT_UP_TO, 10
    try:
        logged = mcnemar_exact(560, 440)
    finally:
        acc.EXACT_UP_TO = acc_up
    assert logged == pytest.approx(exact, rel=1e-9)


def test_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


# --- minimum detectable difference ---


def test_min_detectable_difference_inverts_connors_sample_size():
    # psi 0.1, delta 0.05, alpha 0.05, power 0.8: n = (1.95996*sqrt(.1) + 0.84162*sqrt(.0975))^2 / .0025 = 311.6
    assert min_detectable_difference(312, 0.8, 0.10) == pytest.approx(5.0, abs=0.02)


def test_more_items_detect_a_smaller_difference():
    assert min_detectable_difference(2000, 0.8, 0.1) < min_detectable_difference(500, 0.8, 0.1)


def test_more_disagreement_needs_a_larger_difference():
    assert min_detectable_difference(500, 0.8, 0.2) > min_detectable_difference(500, 0.8, 0.05)


def test_too_few_items_detect_nothing():
    assert min_detectable_difference(5, 0.8, 0.1) is None


def test_a_drop_beyond_the_baseline_accuracy_is_not_detectable():
    assert min_detectable_difference(40, 0.1, 0.5) is None


@pytest.mark.parametrize("bad", [{"n_items": 0}, {"base_acc": 0.0}, {"discordance": 1.5}, {"power": 1.0}])
def test_min_detectable_difference_refuses_bad_inputs(bad):
    args = {"n_items": 100, "base_acc": 0.8, "discordance": 0.1, "alpha": 0.05, "power": 0.8, **bad}
    with pytest.raises(ValueError):
        min_detectable_difference(**args)


@pytest.mark.parametrize(("df", "exact"), [(5, 2.570582), (10, 2.228139), (24, 2.063899), (100, 1.983972)])
def test_the_t_quantile_is_close_to_the_tables(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, abs=1e-3)


# --- recovery ---


def test_recovery_is_candidate_over_baseline_accuracy():
    r = recovery([True] * 8 + [False] * 2, [True] * 6 + [False] * 4, [str(i % 5) for i in range(10)])
    assert r.estimate == pytest.approx(75.0)


def test_recovery_interval_contains_the_estimate():
    rng = np.random.default_rng(0)
    base = (rng.random(200) < 0.8).tolist()
    cand = [b and rng.random() > 0.1 for b in base]
    r = recovery(base, cand, [str(i % 20) for i in range(200)])
    assert r.interval[0] <= r.estimate <= r.interval[1]


def test_recovery_of_a_baseline_with_nothing_right_is_undefined():
    r = recovery([False] * 5, [True] * 5, ["a"] * 5)
    assert (r.estimate, r.interval) == (None, None)


def test_recovery_of_identical_answers_is_exactly_100():
    base = [True, False, True, True] * 10
    r = recovery(base, list(base), [str(i % 8) for i in range(40)])
    assert r.interval == (100.0, 100.0)


def test_recovery_is_seeded():
    base = [True, True, False, True] * 25
    cand = [True, False, False, True] * 25
    cl = [str(i % 10) for i in range(100)]
    assert recovery(base, cand, cl, seed=3).interval == recovery(base, cand, cl, seed=3).interval


def test_recovery_refuses_unpaired_lists():
    with pytest.raises(ValueError):
        recovery([True], [True, False], ["a"])


def test_the_recovery_interval_covers_the_truth_on_clustered_data():
    """400 seeded studies of 40 clusters x 10 items: cluster difficulty p in {.3,.5,.7,.9}; the
    candidate loses a right answer with a cluster's own rate (0 or 0.2) and gains a wrong one with
    0.05. True recovery: (0.6 x 0.9 + 0.4 x 0.05) / 0.6 = 93.33 %. A 95 % interval covers it in at
    least 93 % of the studies."""
    rng = np.random.default_rng(123)
    k, m = 40, 10
    truth = (0.6 * 0.9 + 0.4 * 0.05) / 0.6 * 100
    clusters = np.repeat(np.arange(k), m).astype(str).tolist()
    hits = 0
    for s in range(400):
        p = rng.choice([0.3, 0.5, 0.7, 0.9], size=k)[:, None]
        base = rng.random((k, m)) < p
        lose = rng.random((k, m)) < rng.choice([0.0, 0.2], size=k)[:, None]
        cand = np.where(base, ~lose, rng.random((k, m)) < 0.05)
        r = recovery(base.ravel().tolist(), cand.ravel().tolist(), clusters, seed=s)
        hits += r.interval[0] <= truth <= r.interval[1]
    assert hits / 400 >= 0.93


# --- log-likelihood choice ---

ITEM = ChoiceItem("x", "Which is a fruit?", ("An apple", "A chair", "Stone", "A very long option text"), 0, "s", "s")


def test_continuations_have_a_leading_space():
    assert continuations(ITEM) == [" An apple", " A chair", " Stone", " A very long option text"]


def test_the_context_ends_with_answer():
    assert context(ITEM) == "Question: Which is a fruit?\nAnswer:"


def _scores(logprobs: list[float], tokens: list[int]) -> list[OptionScore]:
    return [OptionScore.of(c, lp, t) for c, lp, t in zip(continuations(ITEM), logprobs, tokens, strict=True)]


def test_acc_picks_the_highest_summed_logprob():
    assert choose(_scores([-4.0, -3.0, -5.0, -9.0], [2, 2, 1, 5])).acc == 1


def test_acc_norm_divides_by_characters():
    # " A very long option text": -8.0 over 24 characters (-0.33) beats " A chair": -3.0 over 8 (-0.375),
    # though -3.0 is the highest sum (acc picks option 1)
    assert choose(_scores([-4.0, -3.0, -5.0, -8.0], [2, 2, 1, 5])).acc_norm == 3


def test_acc_tokens_divides_by_the_token_count():
    assert choose(_scores([-4.0, -3.0, -1.5, -9.0], [2, 2, 1, 10])).acc_tokens == 3


def test_acc_bytes_counts_utf8_bytes():
    s = [OptionScore.of(" café", -5.0, 2), OptionScore.of(" cafe", -4.9, 2)]
    # -5.0 / 6 bytes = -0.833 beats -4.9 / 5 bytes = -0.98; by characters both are 5: -4.9 wins
    assert (choose(s).acc_bytes, choose(s).acc_norm) == (0, 1)


def test_a_tie_goes_to_the_first_option():
    assert choose(_scores([-2.0, -2.0, -3.0, -4.0], [1, 1, 1, 1])).acc == 0


def test_an_empty_continuation_cannot_be_scored():
    with pytest.raises(ValueError, match="empty continuation"):
        choose([OptionScore(-1.0, 0, 0, 0)])


def test_accuracy_over_items_per_rule():
    picks = [choose(_scores([-1.0, -3.0, -5.0, -9.0], [1, 1, 1, 1])), choose(_scores([-9.0, -3.0, -5.0, -8.0],
                                                                                        [1, 1, 1, 1]))]
    assert accuracy(picks, [0, 0])["acc"] == 0.5


def test_recovery_from_one_correct_baseline_item_has_no_interval():
    # [0, 0] from a bootstrap of one success would claim a certainty the data do not have (issue 46)
    from evalkit.stats.accuracy import recovery

    assert recovery([True] + [False] * 5, [False] * 6).interval is None


def test_recovery_says_why_it_has_no_interval():
    from evalkit.stats.accuracy import recovery

    assert "an interval needs 5" in recovery([True, True] + [False] * 10, [True] + [False] * 11).method
