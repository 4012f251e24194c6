"""`evalkit check`: thresholds each grader declares, percentile targets, margins; one line per
failure, JUnit XML; the old flags still work for one release, with a warning."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from evalkit.cli import cli


def test_check_passes_and_fails_with_one_line_per_failure(runner, stub_ledger, tmp_path):
    ok = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "schema_pass=0.9",
                             "--max-error-rate", "0", "--target", "ttft_p99=5000"])
    assert ok.exit_code == 0, ok.output
    assert "check run " in ok.output
    assert "6 passed, 0 failed" in ok.output
    assert "FAIL" not in ok.output

    junit = tmp_path / "gate.xml"
    # the candidate stub answers in 25 ms, the baseline in 5 ms: a 15 ms TTFT p50 limit fails only the candidate
    bad = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--target", "ttft_p50=15,e2e_p99=60000",
                              "--threshold", "formality_mae=0", "--junit", str(junit)])
    assert bad.exit_code == 1, bad.output
    fails = [x for x in bad.output.splitlines() if x.startswith("FAIL ")]
    assert any(x.startswith("FAIL cand: ttft p50") for x in fails)
    assert not any(x.startswith("FAIL base: ttft p50") for x in fails)
    assert any("formality_mae" in x for x in fails)
    assert bad.output.strip().splitlines()[-1].startswith("Error: ")
    assert "check(s) failed" in bad.output
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite"
    assert int(suite.get("failures")) == len(fails)
    assert int(suite.get("tests")) == 6
    assert len(suite.findall("testcase/failure")) == len(fails)


def test_drift_gate_and_usage_errors(runner, stub_ledger):
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "drift_above_floor=0"])
    # identical stub outputs: drift − floor is 0 with a zero-width interval, which does not lie above 0
    assert r.exit_code == 0, r.output
    assert "1 passed, 0 failed" in r.output, r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger)])
    assert r.exit_code == 2
    assert "at least one threshold" in r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "schema_pass=2"])
    assert r.exit_code == 2
    assert "schema_pass is a share" in r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "nope=1"])
    assert r.exit_code == 2
    assert "unknown name 'nope'" in r.output
    assert "schema_pass" in r.output


def test_the_old_check_flags_are_gone(runner, stub_ledger):
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--min-schema", "0.9"])
    assert r.exit_code == 2


@pytest.fixture
def swept_ledger(runner, endpoint_matrix, tmp_path):
    """Two stubs swept at concurrency 1 and 2, the matrix carrying its own margins."""
    from evalkit.testing.stub_server import StubConfig, StubServer

    # 100 ms apart: one stall of a loaded CI machine in 12 pairs must not widen the interval across 0;
    # 24 cases: at c=2 the pairs are the alternation's chunks, twelve of two cases
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=105, itl_ms=1)) as b:
        m = endpoint_matrix(a.base_url, b.base_url, warmup=0, extra="margins: {e2e_mean: +0%}\n")
        ledger = tmp_path / "sweep.db"
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "24", "--sweep", "1,2", "--ledger", str(ledger),
                                "-q", "--no-grade"])
        assert r.exit_code == 0, r.output
    return ledger


def test_a_sweep_s_gate_compares_level_with_level(runner, swept_ledger):
    out = runner.invoke(cli, ["check", "--ledger", str(swept_ledger), "--margins", "e2e_mean=+500%"]).output
    assert "2 passed, 0 failed" in out  # one margin check per level both variants reached


def test_a_loaded_level_s_verdict_pairs_its_chunks(runner, swept_ledger):
    out = runner.invoke(cli, ["check", "--ledger", str(swept_ledger)]).output  # the matrix's +0 %: fails, said
    loaded = next(x for x in out.splitlines() if "e2e_mean at c=2" in x)
    assert "12 block pairs" in loaded, loaded


def test_the_gate_and_the_report_agree_at_the_first_level(runner, swept_ledger):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(swept_ledger), "--json"]).output)
    reported = rep["findings"]["verdicts"][0]
    out = runner.invoke(cli, ["check", "--ledger", str(swept_ledger)]).output
    line = next(x for x in out.splitlines() if "e2e_mean at c=1" in x)
    assert f"{reported['estimate']:+.3g} %" in line


def test_check_without_flags_checks_the_matrix_s_margins(runner, swept_ledger):
    r = runner.invoke(cli, ["check", "--ledger", str(swept_ledger)])
    assert r.exit_code == 1  # the candidate is 100 ms slower: inferior against a +0 % margin
    assert "FAIL cand: e2e_mean at c=1: inferior" in r.output


def test_recommend_reads_the_same_first_level_rows_as_the_report(runner, swept_ledger):
    out = json.loads(runner.invoke(cli, ["recommend", "--ledger", str(swept_ledger), "--target", "ttft_p99=5000",
                                         "--json"]).output)
    batch = {o["variant"]: o["n"] for o in out if o["workload"].startswith("batch")}
    assert batch == {"base": 24, "cand": 24}


def _verdict(verdict: str, pairs: int = 24, need: int = 9) -> dict:
    return {"variant": "cand", "metric": "e2e_mean", "verdict": verdict, "estimate": 3.0, "ci": [-1.0, 7.0],
            "ci_level": 0.975, "unit": "%", "margin": 5.0, "margin_text": "+5 %", "why": "the interval reaches across",
            "statistic": "ratio of means, failed requests at the worst value", "pairs": pairs, "need_pairs": need,
            "failures": {"candidate": 2, "baseline": 0}, "level": None}


def test_an_undecided_margin_is_counted_apart_not_as_passed():
    from evalkit.reporting.gate import margin_check, summary_line

    checks = [margin_check(_verdict("non-inferior"), False, False), margin_check(_verdict("inconclusive"), False, False)]
    assert summary_line(checks).startswith("1 passed, 0 failed, 1 undecided")


def test_require_decided_fails_an_undecided_margin():
    from evalkit.reporting.gate import margin_check

    assert not margin_check(_verdict("inconclusive"), False, True).passed


def test_require_decided_keeps_a_decided_margin_passed():
    from evalkit.reporting.gate import margin_check

    assert margin_check(_verdict("superior"), False, True).passed


def test_a_margin_line_says_its_statistic_pairs_and_failures():
    from evalkit.reporting.gate import margin_check

    msg = margin_check(_verdict("inconclusive"), False, False).message
    assert "ratio of means, failed requests at the worst value; 24 pairs, 2 failed requests (candidate 2" in msg


def test_a_run_too_small_to_decide_is_said():
    from evalkit.reporting.gate import margin_check

    msg = margin_check(_verdict("inconclusive", pairs=6, need=9), False, False).message
    assert "too small to decide: 6 pairs, at least 9 needed" in msg


@pytest.mark.parametrize(("text", "limit"), [("0.95", 0.95), ("95%", 0.95), ("95pp", 0.95)])
def test_a_share_threshold_takes_a_share_or_percent(text, limit):
    from evalkit.reporting.gate import threshold_value

    assert threshold_value(f"top1_agreement={text}", "top1_agreement", text, True) == pytest.approx(limit)


def test_a_share_threshold_out_of_range_is_refused():
    from evalkit.errors import UsageError
    from evalkit.reporting.gate import threshold_value

    with pytest.raises(UsageError, match="0-100 %"):
        threshold_value("schema_pass=95", "schema_pass", "95", True)


def test_check_with_require_decided_exits_non_zero_on_an_undecided_run(runner, stub_ledger):
    args = ["check", "--ledger", str(stub_ledger), "--margins", "schema_pass=-1pp"]
    loose = runner.invoke(cli, args)
    assert "1 undecided" in loose.output or "2 undecided" in loose.output, loose.output
    assert runner.invoke(cli, [*args, "--require-decided"]).exit_code == 1


def test_a_check_with_nothing_to_check_reads_no_row(stub_ledger, monkeypatch):
    """The usage error comes from the run's record alone (it took 34 s and 480 MB at a million rows)."""
    from evalkit.errors import UsageError
    from evalkit.ledger import open_ledger
    from evalkit.reporting import gate

    for reader in ("build_report", "ledger_verdicts"):  # what reads the rows
        monkeypatch.setattr(gate, reader, lambda *a, **k: pytest.fail("a row was read"))
    with open_ledger(stub_ledger, create=False) as db, pytest.raises(UsageError, match="give at least one threshold"):
        gate.run_checks(db, None, gate.GateSpec())
