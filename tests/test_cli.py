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


WRONG = {"refused": lambda stub: f"http://127.0.0.1:{free_port()}",
         "no such host": lambda stub: "http://no-such-host.invalid:8000",
         "wrong path": lambda stub: stub.base_url + "/v1"}  # /v1/v1/models: 404


def _run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong: str):
    url = WRONG[wrong](stub)
    m = endpoint_matrix(stub.base_url, url)
    return url, runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "2", "--ledger",
                                    str(ledger_path), "-q"])


def _count(ledger_path: Path, table: str) -> int:
    return Database(ledger_path)[table].count if ledger_path.exists() else 0


@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_endpoint_is_a_usage_error(runner, endpoint_matrix, ledger_path, stub, wrong):
    assert _run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong)[1].exit_code == 2


@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_endpoint_is_one_line(runner, endpoint_matrix, ledger_path, stub, wrong):
    assert len(_run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong)[1].output.strip().splitlines()) == 1


@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_endpoint_names_the_variant_and_url(runner, endpoint_matrix, ledger_path, stub, wrong):
    url, r = _run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong)
    assert r.output.startswith(f"Error: variant 'cand': endpoint {url} does not answer (")


@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_candidate_endpoint_stops_the_run_before_any_request(runner, endpoint_matrix, ledger_path, stub, wrong):
    _run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong)
    assert _count(ledger_path, "requests") == 0


def test_a_wrong_endpoint_writes_no_run(runner, endpoint_matrix, ledger_path, stub):
    _run_wrong(runner, endpoint_matrix, ledger_path, stub, "refused")
    assert _count(ledger_path, "runs") == 0


@pytest.mark.parametrize(("wrong", "says"), [("refused", "connection refused"),
                                             ("no such host", "its host name does not resolve"),
                                             ("wrong path", "HTTP 404 on /v1/models")])
def test_a_wrong_endpoint_says_why(runner, endpoint_matrix, ledger_path, stub, wrong, says):
    assert says in _run_wrong(runner, endpoint_matrix, ledger_path, stub, wrong)[1].output


def test_a_missing_key_variable_stops_the_run_before_any_request(runner, endpoint_matrix, ledger_path, stub,
                                                                 monkeypatch):
    monkeypatch.delenv("EVALKIT_TEST_NO_SUCH_KEY", raising=False)
    m = endpoint_matrix(stub.base_url, stub.base_url)
    m.write_text(m.read_text() + "    api_key_env: EVALKIT_TEST_NO_SUCH_KEY\n")
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "2", "--ledger", str(ledger_path), "-q"])
    assert "EVALKIT_TEST_NO_SUCH_KEY is not set" in r.output


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


LAUNCH = "name: x\nbaseline: base\nvariants:\n  - name: base\n    model: {model}\n"


@pytest.mark.integration  # a run describes its host first (platform asks `uname -p`)
@pytest.mark.parametrize(("model", "python", "says"), [
    ("/no/such/model", None, "variant 'base': model path /no/such/model does not exist"),
    ("bundled:nope", None, "variant 'base': unknown bundled model 'bundled:nope'"),
    ("some-org/some-model", "/no/such/python", "EVALKIT_VLLM_PYTHON=/no/such/python is not an executable file"),
])
def test_a_launched_server_that_cannot_start_is_refused_before_anything_is_written(runner, write, tmp_path, monkeypatch,
                                                                                   model, python, says):
    if python:
        monkeypatch.setenv("EVALKIT_VLLM_PYTHON", python)
    else:
        monkeypatch.delenv("EVALKIT_VLLM_PYTHON", raising=False)
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(write("m.yaml", LAUNCH.format(model=model))),
                            "--ledger", str(tmp_path / "l.db"), "-q"])
    assert says in r.output


# --- --resume with a corrected matrix (issue 46) -------------------------------------------------------------

RESUME_MATRIX = ("name: stubs\nbaseline: base\ngeneration: {{warmup: 0, baseline_repeats: 1, max_tokens: {mt}}}\n"
                 "retry: {{max_retries: 0}}\nvariants:\n  - name: base\n    endpoint: {a}\n  - name: cand\n"
                 "    endpoint: {b}\n")


@pytest.fixture(scope="module")
def corrected(tmp_path_factory):
    """A run whose candidate URL reached the wrong server (every answer an HTTP 500), resumed with
    --retry-failed: first with a matrix that also changes max_tokens (refused), then with only the
    candidate's URL corrected. (outputs, the URLs, the ledger)."""
    from click.testing import CliRunner

    from evalkit.testing.stub_server import StubConfig, StubServer

    runner, tmp = CliRunner(), tmp_path_factory.mktemp("corrected")
    ledger = tmp / "l.db"
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0)) as a, \
            StubServer(StubConfig(ttft_ms=2, itl_ms=0, fault="http_500")) as wrong, \
            StubServer(StubConfig(ttft_ms=2, itl_ms=0)) as right:
        first = tmp / "first.yaml"
        first.write_text(RESUME_MATRIX.format(a=a.base_url, b=wrong.base_url, mt=64))
        out = {"first": runner.invoke(cli, ["run", "--matrix", str(first), "--limit", "4", "--no-grade", "-q",
                                            "--ledger", str(ledger), "--max-error-rate", "1"])}
        assert out["first"].exit_code == 0, out["first"].output
        run_id = next(Database(ledger).query("select id from runs"))["id"]
        resume = ["run", "--resume", run_id, "--retry-failed", "http_5xx", "--no-grade", "-q", "--ledger", str(ledger)]
        other = tmp / "other.yaml"
        other.write_text(RESUME_MATRIX.format(a=a.base_url, b=right.base_url, mt=32))
        out["other"] = runner.invoke(cli, [*resume, "--matrix", str(other)])
        fixed = tmp / "fixed.yaml"
        fixed.write_text(RESUME_MATRIX.format(a=a.base_url, b=right.base_url, mt=64))
        out["fixed"] = runner.invoke(cli, [*resume, "--matrix", str(fixed)])
        yield out, (wrong.base_url, right.base_url), ledger, run_id


def test_a_resume_with_another_difference_is_refused(corrected):
    assert corrected[0]["other"].exit_code == 2


def test_a_resume_with_another_difference_names_the_field(corrected):
    assert "field 'generation.max_tokens' (64 → 32)" in corrected[0]["other"].output


def test_a_resume_with_a_corrected_url_completes(corrected):
    assert corrected[0]["fixed"].exit_code == 0, corrected[0]["fixed"].output


def test_a_resume_with_a_corrected_url_says_what_changed(corrected):
    wrong, right = corrected[1]
    assert f"resume: cand endpoint {wrong} → {right}" in corrected[0]["fixed"].output


def test_a_resume_with_a_corrected_url_records_it_on_the_run(corrected):
    _, _, ledger, run_id = corrected
    assert json.loads(Database(ledger)["runs"].get(run_id)["matrix_json"])["variants"][1]["endpoint"] == corrected[1][1]


def test_a_resume_with_a_corrected_url_answers_every_request(corrected):
    _, _, ledger, run_id = corrected
    rows = list(Database(ledger).query("select error_class from requests where final = 1 and is_warmup = 0"))
    assert [r["error_class"] for r in rows] == [None] * 8
