"""One declaration per measured metric (issue 48, item 3): what a request metric can carry — a
margin on its mean, a percentile target, a per-request SLO, a row of the summaries — is read from
`evalkit.catalogue`, so the margins, targets, SLOs and summaries agree with it and with each other."""

from __future__ import annotations

import pytest

from evalkit.catalogue import DERIVED, REQUEST, USES, named
from evalkit.execution.stops import SLO_METRICS, parse_slo
from evalkit.grading.margins import LATENCY, parse_margins
from evalkit.reporting.findings import LATENCY_FIELDS, parse_targets


@pytest.mark.parametrize(("use", "names"), [
    ("margin", ["ttft", "tpot", "e2e", "itl", "ttfo", "reasoning_tokens", "out_tps"]),
    ("target", ["ttft", "tpot", "e2e", "itl"]),
    ("slo", ["ttft", "tpot", "e2e"]),
    ("summary", ["ttft", "tpot", "e2e", "itl", "out_tps"]),
])
def test_each_use_names_the_metrics_it_always_had(use, names):
    assert list(named(use)) == names


def test_an_unknown_use_is_refused():
    with pytest.raises(ValueError, match="no use 'gate'"):
        named("gate")


@pytest.mark.parametrize("short", list(named("margin")))
def test_every_declared_margin_metric_parses_as_a_margin(short):
    (ms,) = parse_margins(f"{short}_mean=+5%")
    assert ms.metric == f"{short}_mean"


@pytest.mark.parametrize(("short", "m"), list(named("margin").items()))
def test_a_margin_reads_the_declared_column_and_direction(short, m):
    assert LATENCY[f"{short}_mean"] == (m.key, m.higher)


@pytest.mark.parametrize(("short", "m"), list(named("target").items()))
def test_every_declared_target_metric_parses_as_a_target(short, m):
    assert parse_targets(f"{short}_p99=1000") == {(m.key, 99.0): 1000.0}


@pytest.mark.parametrize("short", list(named("slo")))
def test_every_declared_slo_metric_parses_as_an_slo(short):
    assert parse_slo(f"{short}=1500").absolute_ms == {short: 1500.0}


@pytest.mark.parametrize("short", SLO_METRICS)
def test_an_slo_limits_a_request_column_of_its_own_name(short):
    assert named("slo")[short].key == f"{short}_ms"


def test_the_summaries_are_the_declared_ones():
    assert LATENCY_FIELDS == tuple(m.key for m in named("summary").values())


def test_a_target_outside_the_declarations_names_the_declared_ones():
    with pytest.raises(Exception, match="METRIC in ttft, tpot, e2e, itl"):
        parse_targets("srv_ttft_p99=10")


@pytest.mark.parametrize("m", [m for m in (*REQUEST, *DERIVED) if m.uses])
def test_a_metric_with_uses_has_a_short_name_and_known_uses(m):
    assert (bool(m.short), m.uses <= set(USES)) == (True, True)
