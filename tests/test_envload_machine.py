"""`machine_moved`: each cause trips in the back-to-back case and stays quiet where the sides ran
under the same load (alternating, or a difference below its threshold); the CUSUM change-point
test behind the step causes keeps its stated false-alarm rate (issue 47)."""

from __future__ import annotations

import random

import pytest

from evalkit.reporting.machine import BaseSeries, MachineThresholds, SideLoad, machine_moved, overlap
from evalkit.stats.changepoint import kolmogorov_sf, mean_shift


def side(variant: str, first: float, last: float, samples: int = 30, **kw) -> SideLoad:
    base = {"foreign_cpu_mean": 0.02, "steal_mean": 0.01, "throttle_share": 0.0, "gpu_samples": samples}
    return SideLoad(variant=variant, samples=samples, first_ms=first, last_ms=last, **{**base, **kw})


def base_side(**kw) -> SideLoad:
    return side("base", 0.0, 30000.0, **kw)


def cand_side(**kw) -> SideLoad:
    return side("cand", 30000.0, 60000.0, **kw)


def noisy(levels: list[tuple[float, int]], sd: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [max(0.0, lvl + rng.gauss(0.0, sd)) for lvl, n in levels for _ in range(n)]


def test_the_example_line():
    assert machine_moved(base_side(), cand_side(foreign_cpu_mean=0.97)) == \
        "machine load changed: foreign CPU 0.02 → 0.97 cores while cand ran"


@pytest.mark.parametrize("cand,host_cores,moved", [
    ({"foreign_cpu_mean": 0.97}, 2, True),
    ({"foreign_cpu_mean": 0.20}, 2, False),  # 0.18 cores: below 0.25
    ({"foreign_cpu_mean": 0.60}, 2, True),
    ({"foreign_cpu_mean": 0.60}, 8, False),  # 0.58 cores: on 8 cores the bar is 10 % = 0.8
    ({"foreign_cpu_mean": 0.90}, 8, True),
    ({"foreign_cpu_mean": 0.97, "samples": 2}, 2, False),  # too few samples to say
    ({"foreign_cpu_mean": None}, 2, False),  # not measured
])
def test_foreign_cpu(cand, host_cores, moved):
    out = machine_moved(base_side(), cand_side(**cand), host_cores=host_cores)
    assert (out is not None and "foreign CPU" in out) is moved


@pytest.mark.parametrize("cand_steal,moved", [(0.15, True), (0.08, False)])
def test_steal(cand_steal, moved):
    out = machine_moved(base_side(), cand_side(steal_mean=cand_steal))
    assert (out == "machine load changed: steal 1% → 15% of CPU time while cand ran") is moved
    assert (out is None) is not moved


@pytest.mark.parametrize("base_share,cand_share,gpu_samples,moved", [
    (0.0, 0.4, 30, True), (0.4, 0.0, 30, True),
    (0.3, 0.4, 30, False),  # both throttled: the same condition
    (0.0, 0.08, 30, False),  # under the 10 % line
    (0.0, 0.4, 0, False),  # no GPU readings
])
def test_gpu_throttling_on_one_side_only(base_share, cand_share, gpu_samples, moved):
    out = machine_moved(base_side(throttle_share=base_share, gpu_samples=gpu_samples),
                        cand_side(throttle_share=cand_share, gpu_samples=gpu_samples))
    assert (out is not None and "GPU throttled" in out) is moved


STEP_CPU = noisy([(0.03, 20), (0.95, 20)], 0.05)
FLAT_CPU = noisy([(0.5, 40)], 0.05)
SMALL_STEP_CPU = noisy([(0.0, 40), (0.12, 40)], 0.01)  # significant, but a tenth of a core
STEP_E2E = noisy([(800.0, 25), (1200.0, 25)], 40.0)
FLAT_E2E = noisy([(800.0, 50)], 40.0)


@pytest.mark.parametrize("series,moved", [
    (BaseSeries(foreign_cpu=STEP_CPU), True),
    (BaseSeries(foreign_cpu=FLAT_CPU), False),
    (BaseSeries(foreign_cpu=SMALL_STEP_CPU), False),
    (BaseSeries(foreign_cpu=STEP_CPU[:8]), False),  # too short to test
    (BaseSeries(latency=mean_shift(STEP_E2E)), True),
    (BaseSeries(latency=mean_shift(FLAT_E2E)), False),
])
def test_a_step_in_the_baselines_own_series(series, moved):
    same = {"foreign_cpu_mean": 0.5}
    out = machine_moved(base_side(**same), cand_side(**same), series)
    assert (out is not None) is moved
    if moved:
        assert "during base's" in out or "base's own E2E stepped" in out


def test_the_step_line_names_the_levels():
    out = machine_moved(base_side(foreign_cpu_mean=0.5), cand_side(foreign_cpu_mean=0.5),
                        BaseSeries(latency=mean_shift(STEP_E2E)))
    assert out is not None and out.startswith("machine load changed: base's own E2E stepped 8")
    assert "→ 1" in out and "ms during its run (CUSUM p=" in out


def test_alternating_sides_see_the_same_load():
    # interleaved in time: equal means, and the baseline's step is one the candidate saw too
    base = side("base", 0.0, 60000.0, foreign_cpu_mean=0.5)
    cand = side("cand", 500.0, 60500.0, foreign_cpu_mean=0.5)
    assert machine_moved(base, cand, BaseSeries(foreign_cpu=STEP_CPU, latency=mean_shift(STEP_E2E))) is None


def test_several_causes_share_one_line():
    out = machine_moved(base_side(), cand_side(foreign_cpu_mean=0.97, steal_mean=0.3))
    assert out is not None and out.count("machine load changed") == 1 and "; steal" in out


def test_thresholds_are_a_frozen_choice():
    t = MachineThresholds(foreign_cpu_cores=1.0)
    assert machine_moved(base_side(), cand_side(foreign_cpu_mean=0.97), thresholds=t) is None
    with pytest.raises(AttributeError):
        t.steal = 0.5  # type: ignore[misc]


def test_a_side_from_the_ledgers_summary():
    row = {"variant": "cand", "samples": 12, "foreign_cpu_mean": 0.4, "foreign_cpu_n": 12, "first_ms": 1.0}
    assert SideLoad.from_summary(row) == SideLoad(variant="cand", samples=12, foreign_cpu_mean=0.4, first_ms=1.0)


@pytest.mark.parametrize("a,b,share", [((0, 10), (10, 20), 0.0), ((0, 10), (5, 25), 0.5), ((0, 10), (1, 9), 1.0),
                                       ((0, 0), (0, 10), 1.0), ((0, 0), (5, 10), 0.0)])
def test_overlap(a, b, share):
    assert overlap(side("a", *a), side("b", *b)) == share


def test_overlap_unknown():
    assert overlap(SideLoad("a"), side("b", 0, 1)) is None


# --- the change-point test ----------------------------------------------------------------------


@pytest.mark.parametrize("c,p", [(1.358, 0.05), (1.628, 0.01), (0.1, 1.0)])
def test_kolmogorov_tail(c, p):
    assert kolmogorov_sf(c) == pytest.approx(p, abs=5e-4)


def test_mean_shift_finds_the_step():
    s = mean_shift(STEP_CPU)
    assert s is not None and s.index == 20 and s.p_value < 1e-6
    assert (round(s.before, 1), round(s.after, 1)) == (0.0, 1.0)


@pytest.mark.parametrize("values", [[1.0] * 30, [1.0, 2.0, 3.0, 4.0, 5.0]])
def test_mean_shift_needs_a_varying_series_of_two_segments(values):
    assert mean_shift(values) is None


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_false_alarm_rate_on_independent_values(alpha):
    rng = random.Random(47)
    trials = 600
    alarms = sum((s := mean_shift([rng.gauss(0.0, 1.0) for _ in range(60)])) is not None and s.p_value <= alpha
                 for _ in range(trials))
    assert alarms / trials <= alpha * 1.5


def test_false_alarm_rate_on_a_correlated_series():
    # a load sampled every second is autocorrelated: AR(1) with rho 0.5, 120 points, 1 % level
    rng = random.Random(48)

    def ar1(n: int, rho: float) -> list[float]:
        x = [rng.gauss(0.0, 1.0)]
        for _ in range(n - 1):
            x.append(rho * x[-1] + rng.gauss(0.0, 1.0))
        return x

    trials = 300
    alarms = sum((s := mean_shift(ar1(120, 0.5))) is not None and s.p_value <= 0.01 for _ in range(trials))
    assert alarms / trials <= 0.03


# --- one server at a time: the two sides of a chunk ran apart (issue 47) ---------------------------------------


def _blocks(base_cpu: list[float], cand_cpu: list[float], samples: int = 10) -> list[dict]:
    return [{"variant": v, "block": b, "foreign_cpu": x, "steal": 0.0, "samples": samples}
            for v, xs in (("base", base_cpu), ("cand", cand_cpu)) for b, x in enumerate(xs)]


def test_a_step_between_the_sides_of_one_chunk_is_named():
    from evalkit.reporting.machine import block_moved

    assert "chunk 2" in block_moved(_blocks([0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]), "base", "cand")


def test_chunks_whose_sides_agree_say_nothing():
    from evalkit.reporting.machine import block_moved

    assert block_moved(_blocks([0.0, 1.0, 0.5], [0.05, 0.95, 0.5]), "base", "cand") is None


def test_a_side_with_too_few_samples_is_not_judged():
    from evalkit.reporting.machine import block_moved

    assert block_moved(_blocks([0.0], [1.0], samples=2), "base", "cand") is None
