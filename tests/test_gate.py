"""`evalkit check`: thresholds that gate a pipeline, one line per failure, JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from evalkit.cli import cli


def test_check_passes_and_fails_with_one_line_per_failure(runner, stub_ledger, tmp_path):
    ok = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--min-schema", "0.9", "--max-error-rate", "0",
                             "--slo", "ttft_p99=5000"])
    assert ok.exit_code == 0, ok.output
    assert "check run " in ok.output and "6 passed, 0 failed" in ok.output and "FAIL" not in ok.output

    junit = tmp_path / "gate.xml"
    # the candidate stub answers in 25 ms, the baseline in 5 ms: a 15 ms TTFT p50 limit fails only the candidate
    bad = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--slo", "ttft_p50=15,e2e_p99=60000",
                              "--max-formality-mae", "0", "--junit", str(junit)])
    assert bad.exit_code == 1, bad.output
    fails = [x for x in bad.output.splitlines() if x.startswith("FAIL ")]
    assert any(x.startswith("FAIL cand: ttft p50") for x in fails)
    assert not any(x.startswith("FAIL base: ttft p50") for x in fails)
    assert any("formality MAE" in x for x in fails)
    assert bad.output.strip().splitlines()[-1].startswith("Error: ") and "check(s) failed" in bad.output
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and int(suite.get("failures")) == len(fails)
    assert int(suite.get("tests")) == 6 and len(suite.findall("testcase/failure")) == len(fails)


def test_drift_gate_and_usage_errors(runner, stub_ledger):
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--max-drift-above-floor", "0"])
    # identical stub outputs: drift − floor is 0 with a zero-width interval, which does not lie above 0
    assert r.exit_code == 0 and "1 passed, 0 failed" in r.output, r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger)])
    assert r.exit_code == 2 and "at least one threshold" in r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--min-schema", "2"])
    assert r.exit_code == 2 and "--min-schema" in r.output
