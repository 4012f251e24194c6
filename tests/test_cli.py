"""CliRunner per command group: exit codes, output, and the rows the ledger ends up with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.engines.vllm_server import free_port

from .ledger_integrity import not_a_ledger


@pytest.mark.integration
def test_help_explains_commands(runner):
    r = runner.invoke(cli, ["--help"])
    assert r.exit_code == 0
    for cmd in ("run", "report", "grade", "dataset", "matrix", "ledger"):
        assert cmd in r.output
    r = runner.invoke(cli, ["run", "--help"])
    assert "--limit" in r.output
    assert "stratified" in r.output


def test_run_two_endpoints_writes_one_row_per_request(runner, stub_pair, endpoint_matrix, ledger_path):
    a, b = stub_pair
    m = endpoint_matrix(a.base_url, b.base_url, warmup=1)
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "6", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 0, r.output
    assert "12 requests, 0 errors" in r.output
    db = Database(ledger_path)
    rows = list(db["requests"].rows)
    # one warm-up per output schema in use (both tasks are in the subset), two timing probes
    # (short, long), then the six cases
    assert len(rows) == 2 * (6 + 2 + 2)
    assert sum(x["is_warmup"] for x in rows) == 8
    assert sum("-probe-long-" in x["case_id"] for x in rows) == 2
    assert all(x["case_id"].startswith("_warmup-") for x in rows if x["is_warmup"])
    assert all(x["ttft_ms"] > 0 and x["e2e_ms"] >= x["ttft_ms"] and x["text"] for x in rows)
    assert all(x["completion_tokens"] > 0 and x["prompt_tokens"] > 0 for x in rows)
    assert {x["variant"] for x in rows} == {"base", "cand"}
    # schema grades for every non-warmup successful request
    grades = list(db["grades"].rows_where("grader = 'schema'"))
    assert len(grades) == 12
    assert all(g["passed"] == 1 for g in grades)
    run = next(db["runs"].rows)
    assert run["status"] == "complete"
    assert run["n_cases"] == 6
    assert len(run["dataset_hash"]) == 64
    assert {v["status"] for v in db["variants"].rows} == {"complete"}

    # report: table, JSON and Markdown
    r = runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json"])
    assert r.exit_code == 0
    rep = json.loads(r.output)
    assert rep["baseline"] == "base"
    rows_by = {(x["variant"], x["complexity"]): x for x in rep["rows"]}
    assert rows_by[("base", "all")]["n"] == 6
    assert rows_by[("cand", "all")]["n"] == 6
    assert rows_by[("base", "all")]["schema_pass_pct"] == 100.0
    assert rows_by[("base", "long")]["ttft_p50_delta_pct"] == 0.0
    # the candidate stub has a 25 ms TTFT against 5 ms: the delta must show it
    assert rows_by[("cand", "all")]["ttft_p50_delta_pct"] > 100
    r = runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--markdown"])
    assert r.exit_code == 0
    assert r.output.startswith("host: ")  # the machine is part of the result
    assert "\n| variant | slice | n |" in r.output
    r = runner.invoke(cli, ["report", "--ledger", str(ledger_path)])
    assert r.exit_code == 0
    assert "TTFT p50" in r.output
    assert "cand" in r.output

    # re-grading adds nothing new for the same grader version
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger_path)])
    assert r.exit_code == 0
    assert "0 new grades" in r.output


@pytest.mark.integration
def test_failed_requests_are_rows_and_counted(runner, endpoint_matrix, ledger_path):
    from evalkit.testing.stub_server import StubConfig, StubServer

    with StubServer(StubConfig(fault="http_500", fault_every=2, ttft_ms=1, itl_ms=0)) as s:
        m = endpoint_matrix(s.base_url, warmup=0)
        r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "6", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    errs = list(db["requests"].rows_where("error_class is not null"))
    assert db["requests"].count == 6
    assert len(errs) == 3
    assert all(e["error_class"] == "http_500" and e["http_status"] == 500 for e in errs)
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json"]).output)
    assert next(x for x in rep["rows"] if x["complexity"] == "all")["n_errors"] == 3


def test_unreachable_endpoint_is_a_one_line_runtime_error(runner, endpoint_matrix, ledger_path, stub):
    dead = f"http://127.0.0.1:{free_port()}"
    m = endpoint_matrix(stub.base_url, dead)
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "2", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: variant(s) failed: cand")
    assert dead in last
    assert "Traceback" not in r.output
    db = Database(ledger_path)
    v = db["variants"].get(next(db["runs"].rows)["id"] + ":cand")
    assert v["status"] == "failed"
    assert "unreachable" in v["error"]
    assert db["requests"].count == 5  # the reachable variant still ran (1 warmup + 2 probes + 2)


@pytest.mark.integration
def test_bad_inputs_exit_2_with_one_line(runner, write, shipped_rows, tmp_path):
    bad_ds = write("bad.jsonl", json.dumps({**shipped_rows[0], "formality": 7}) + "\n")
    r = runner.invoke(cli, ["dataset", "validate", str(bad_ds)])
    assert r.exit_code == 2
    assert r.output.strip() == (f"Error: {bad_ds}:1: field 'formality': Input should be less than or equal to 5 "
                                "(grader 'persona' reads it)")
    bad_m = write("m.yaml", "name: x\nbaseline: a\nvariants:\n  - name: a\n    model: m\n    flavour: 1\n")
    r = runner.invoke(cli, ["matrix", "validate", str(bad_m)])
    assert r.exit_code == 2
    assert f"{bad_m}:6: field 'variants.0.flavour': unknown key" in r.output
    r = runner.invoke(cli, ["run", "--matrix", str(bad_m), "--ledger", str(tmp_path / "x.db")])
    assert r.exit_code == 2
    assert not (tmp_path / "x.db").exists()  # nothing half written
    r = runner.invoke(cli, ["run", "--limit", "0"])
    assert r.exit_code == 2
    assert "--limit" in r.output
    r = runner.invoke(cli, ["report", "--ledger", str(tmp_path / "none.db")])
    assert r.exit_code == 2
    assert "ledger not found" in r.output
    notledger = not_a_ledger(write("n.db", "plain text, not sqlite" * 50))
    r = runner.invoke(cli, ["report", "--ledger", str(notledger)])
    assert r.exit_code == 2
    assert "not a SQLite database" in r.output
    r = runner.invoke(cli, ["report", "--json", "--markdown", "--ledger", str(notledger)])
    assert r.exit_code == 2
    r = runner.invoke(cli, ["grade", "--grader", "nope", "--ledger", str(tmp_path / "none.db")])
    assert r.exit_code == 2


@pytest.mark.integration
def test_validate_commands_on_shipped_files(runner):
    r = runner.invoke(cli, ["dataset", "validate"])
    assert r.exit_code == 0
    assert "144 cases OK" in r.output
    r = runner.invoke(cli, ["matrix", "validate"])
    assert r.exit_code == 0
    assert "base (baseline), w8a8" in r.output


@pytest.mark.integration
def test_ledger_path(runner, tmp_path: Path):
    r = runner.invoke(cli, ["ledger", "path", "--ledger", str(tmp_path / "a.db")])
    assert r.exit_code == 0
    assert r.output.strip() == str((tmp_path / "a.db").resolve())
