"""A workload's own grader is first-class in every command (issue 33): a receipts workload in a
temporary folder (not shipped) with a field-match grader beside its matrix, margins on it, run on
two stub endpoints; then plan, check (the matrix's margins, --margins, --threshold), browse's
queries, publish's card, graders list and grade --grader-path, each from the workload folder and
from another directory, with nothing of the run's process left (the registry forgets the plugin
between commands, as a new process would). Then a grader that raises on some cases: every other
request still graded, its failures rows, one closing line, exit 1, `grade --retry-failed`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.grading import registry
from evalkit.ledger import copy_ledger, open_ledger
from evalkit.testing.stub_server import StubConfig, StubServer

pytestmark = pytest.mark.integration  # stub servers, a run, subprocesses

PLUGIN = '''
import json

from evalkit.grading import (Aggregate, CannedQuery, GradedRequest, Grader, Margin, Metric, Score, Threshold,
                             mean, pass_pct)


class FieldMatchAggregate(Aggregate):
    columns = (Metric("fieldmatch_mean", "fields matched", 2, "share of the reference's fields the answer has", ""),
               Metric("fieldmatch_pass_pct", "all fields %", 0, "answers with every reference field", "%"))
    thresholds = (Threshold("fieldmatch_mean", "fieldmatch_mean", "min", "minimum share of fields matched"),)
    margins = (Margin("fieldmatch", "abs", True, "share of fields matched, candidate minus baseline"),)
    view_columns = (("fieldmatch", "value"),)
    canned_queries = (CannedQuery("fieldmatch_worst", "Answers with the fewest fields", "lowest", "fieldmatch"),)

    @classmethod
    def summarise(cls, grades, base_grades):
        return {"fieldmatch_mean": mean([g["value"] for g in grades]), "fieldmatch_pass_pct": pass_pct(grades)}


class FieldMatch(Grader):
    name = "fieldmatch"
    version = "1"
    default = False
    description = "fields of the reference answer found in the answer"
    requires = ("reference",)
    aggregate = FieldMatchAggregate

    def grade(self, item: GradedRequest) -> Score:
        ref = json.loads(item.case.reference)
        if item.case.attributes.get("difficulty") == "hard" and RAISE_ON_HARD:
            ref["line_total"] = ref["missing"]["line_total"]  # a bug on the hard cases only: KeyError
        got = json.loads(item.text) if item.text.startswith("{") else {}
        share = sum(k in got for k in ref) / len(ref)
        return Score(share, share == 1.0, f"{share:.0%} of the fields")
'''
EXTRA = '''
from evalkit.grading import Aggregate, GradedRequest, Grader, Metric, Score, mean


class CharCountAggregate(Aggregate):
    columns = (Metric("charcount_mean", "characters", 0, "mean characters per answer", "chars"),)


class CharCount(Grader):
    name = "charcount"
    version = "1"
    default = False
    description = "characters per answer"
    aggregate = CharCountAggregate

    def grade(self, item: GradedRequest) -> Score:
        return Score(float(len(item.text)), None, f"{len(item.text)} characters")
'''
SCHEMA = {"type": "object", "required": ["merchant", "total", "currency"],
          "properties": {"merchant": {"type": "string"}, "total": {"type": "number"},
                         "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}}


def _cases(n: int = 8) -> list[dict]:
    out = []
    for i in range(1, n + 1):
        out.append({"id": f"r-{i:02d}", "schema": "receipt", "difficulty": "hard" if i % 4 == 3 else "easy",
                    "language": "de" if i % 2 else "en",
                    "reference": json.dumps({"merchant": "Shop", "total": 12.5, "currency": "EUR"}),
                    "messages": [{"role": "user", "content": f"Extract receipt {i}: Shop, 12.50 EUR"}]})
    return out


def _workload(folder: Path, a: str, b: str, *, raise_on_hard: bool = False) -> Path:
    (folder / "schemas").mkdir(parents=True)
    (folder / "schemas" / "receipt.schema.json").write_text(json.dumps(SCHEMA))
    (folder / "dataset.jsonl").write_text("".join(json.dumps(c) + "\n" for c in _cases()))
    (folder / "fieldmatch.py").write_text(f"RAISE_ON_HARD = {raise_on_hard}\n" + PLUGIN)
    (folder / "matrix.yaml").write_text(
        "name: receipts\nbaseline: base\nmargins: {e2e_mean: +900%, fieldmatch: 0.5}\n"
        "graders: [schema, fieldmatch:FieldMatch]\n"
        "generation: {max_tokens: 64, warmup: 0}\n"  # baseline_repeats 2 by default: drift's floor
        f"variants:\n  - name: base\n    endpoint: {a}\n  - name: w8a8\n    endpoint: {b}\n")
    return folder


def forget() -> None:
    """What a new process would not know: the plugin modules, their folders on the import path."""
    for name in ("fieldmatch", "charcount"):
        registry._LOCAL.pop(name, None)
        registry._ROOTS.pop(name, None)
        registry._ORIGIN.pop(name, None)
        sys.modules.pop(name, None)
    registry.UNRESOLVED.clear()
    sys.path[:] = [p for p in sys.path if "receipts" not in p and "extra-graders" not in p]
    registry.available.cache_clear()


@pytest.fixture(scope="module")
def receipts(tmp_path_factory):
    """The workload run once from its own folder (`run --workload .`, `-q`), on two stubs."""
    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("issue33")
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=10, itl_ms=1)) as b:
        folder = _workload(tmp / "receipts", a.base_url, b.base_url)
        ledger = tmp / "receipts.db"
        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        import os

        cwd = os.getcwd()
        os.chdir(folder)
        try:
            ran = CliRunner().invoke(cli, ["run", "--workload", ".", "--ledger", str(ledger), "-q"])
        finally:
            os.chdir(cwd)
    forget()
    yield folder, ledger, elsewhere, ran
    forget()


@pytest.fixture(params=["workload", "elsewhere"])
def where(request, receipts, monkeypatch):
    """Each command from the workload folder and from another directory, the plugin forgotten."""
    forget()
    monkeypatch.chdir(receipts[0] if request.param == "workload" else receipts[2])
    yield request.param
    forget()


def test_the_run_exits_0(receipts):
    assert receipts[3].exit_code == 0, receipts[3].output


def test_the_run_records_the_plugin_with_its_folder(receipts):
    run = open_ledger(receipts[1], create=False).require_run()
    assert json.loads(run["graders_json"])[1] == {"target": "fieldmatch:FieldMatch", "path": str(receipts[0].resolve())}


def test_plan_reads_the_plugin_s_margin(runner, receipts, where):
    r = runner.invoke(cli, ["plan", "--ledger", str(receipts[1]), "--detect", "e2e_mean=5"])
    assert r.exit_code == 0, r.output


def test_plan_detects_a_difference_in_the_plugin_s_margin(runner, receipts, where):
    r = runner.invoke(cli, ["plan", "--ledger", str(receipts[1]), "--detect", "fieldmatch=0.1"])
    assert "fieldmatch: to detect 0.1" in r.output, r.output


def test_check_gates_on_the_matrix_s_plugin_margin(runner, receipts, where):
    assert "margin fieldmatch" in _junit(runner, receipts, where, [])


def test_check_takes_the_plugin_s_margin_from_the_command_line(runner, receipts, where):
    r = runner.invoke(cli, ["check", "--ledger", str(receipts[1]), "--margins", "e2e_mean=+900%,fieldmatch=0.5"])
    assert r.exit_code == 0, r.output


def test_check_takes_the_plugin_s_threshold(runner, receipts, where):
    r = runner.invoke(cli, ["check", "--ledger", str(receipts[1]), "--threshold", "fieldmatch_mean=0.5"])
    assert r.exit_code == 0, r.output


def test_a_failing_plugin_threshold_fails_the_gate(runner, receipts, where):
    r = runner.invoke(cli, ["check", "--ledger", str(receipts[1]), "--threshold", "fieldmatch_mean=1.5"])
    assert "FAIL base: fieldmatch_mean" in r.output


def _junit(runner, receipts, where, extra: list[str]) -> str:
    out = receipts[2] / f"junit-{where}.xml"
    runner.invoke(cli, ["check", "--ledger", str(receipts[1]), "--junit", str(out), *extra])
    return out.read_text()


def test_the_report_shows_the_plugin_s_columns(runner, receipts, where):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--json"]).output)
    assert rep["rows"][0]["fieldmatch_mean"] == 1.0


def test_graders_list_shows_the_plugin(runner, receipts, where):
    r = runner.invoke(cli, ["graders", "list", "--ledger", str(receipts[1])])
    assert "threshold fieldmatch_mean" in r.output, r.output


def test_graders_list_in_the_workload_folder_needs_no_option(runner, receipts, monkeypatch):
    forget()
    monkeypatch.chdir(receipts[0])
    assert "fieldmatch v1" in runner.invoke(cli, ["graders", "list", "--ledger", "none.db"]).output


def test_graders_list_finds_the_modules_of_a_grader_path(runner, receipts, monkeypatch):
    forget()
    monkeypatch.chdir(receipts[2])
    r = runner.invoke(cli, ["graders", "list", "--ledger", "none.db", "--grader-path", str(receipts[0])])
    assert "margin fieldmatch" in r.output, r.output


def test_browse_lists_the_plugin_s_canned_query(receipts, where):
    from evalkit.sharing.browse import queries, refresh_derived

    with open_ledger(receipts[1], create=False) as led:
        refresh_derived(led)
    assert "fieldmatch_worst" in queries()


def test_grade_with_a_grader_path_adds_a_grader_found_later_from_anywhere(runner, receipts, tmp_path, monkeypatch):
    extra = tmp_path / "extra-graders"
    extra.mkdir()
    (extra / "charcount.py").write_text(EXTRA)
    ledger = copy_ledger(receipts[1], tmp_path / "copy.db")  # the backup API: the -wal's rows too, no lock dropped
    forget()
    monkeypatch.chdir(receipts[2])
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger), "--grader-path", str(extra), "--grader",
                            "charcount:CharCount"])
    assert r.exit_code == 0, r.output
    forget()
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger), "--json"]).output)
    assert rep["rows"][0]["charcount_mean"] > 0


def test_check_from_another_process_and_directory(receipts):
    """No in-process state at all: a fresh interpreter in another directory."""
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "cli.py"), "check", "--ledger", str(receipts[1]), "--threshold",
                        "fieldmatch_mean=0.5", "--margins", "fieldmatch=0.5"],
                       cwd=receipts[2], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def raising(tmp_path_factory):
    """The same workload whose grader raises KeyError on its hard cases (r-03, r-07)."""
    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("issue33-raising")
    forget()
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as b:
        folder = _workload(tmp / "receipts", a.base_url, b.base_url, raise_on_hard=True)
        ledger = tmp / "raising.db"
        ran = CliRunner().invoke(cli, ["run", "--workload", str(folder), "--ledger", str(ledger), "-q"])
    forget()
    yield folder, ledger, ran
    forget()


def _grades(ledger: Path) -> list[dict]:
    db = open_ledger(ledger, create=False)
    return db.export_tables(db.require_run()["id"])["grades"]


def test_a_grader_that_raises_makes_the_run_exit_1(raising):
    assert raising[2].exit_code == 1, raising[2].output


def test_the_run_names_what_failed_in_one_line(raising):
    assert "fieldmatch failed on 4 of 16 requests: KeyError 'missing'; first: case r-03" in raising[2].output


def test_the_exit_says_grading_is_incomplete(raising):
    assert "grading incomplete" in raising[2].output


def test_every_other_request_is_still_graded(raising):
    assert sum(g["error_class"] is None for g in _grades(raising[1]) if g["grader"] == "fieldmatch") == 12


def test_each_failure_is_a_row_with_its_class(raising):
    assert sorted({g["error_class"] for g in _grades(raising[1]) if g["error_class"]}) == ["KeyError"]


def test_the_report_summarises_the_graded_requests_only(runner, raising):
    forget()
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(raising[1]), "--json"]).output)
    assert rep["rows"][0]["fieldmatch_mean"] == 1.0


def test_grade_retry_failed_grades_just_those_again(runner, raising, tmp_path):
    ledger = copy_ledger(raising[1], tmp_path / "retry.db")
    plugin = raising[0] / "fieldmatch.py"
    plugin.write_text(plugin.read_text().replace("RAISE_ON_HARD = True", "RAISE_ON_HARD = False"))
    forget()
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger), "--retry-failed"])
    assert r.output.splitlines()[0].endswith(": 4 new grades"), r.output


def test_grade_without_retry_failed_leaves_the_failures(runner, raising, tmp_path):
    ledger = copy_ledger(raising[1], tmp_path / "again.db")
    forget()
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger)])
    assert r.exit_code == 1, r.output


def test_the_report_names_the_failures(runner, raising):
    forget()
    out = runner.invoke(cli, ["report", "--ledger", str(raising[1]), "--markdown"]).output
    assert "fieldmatch failed on 4 of 16 requests" in out


# --- partial fields (issue 33, 3): the rows named, the others graded ------------------------------


def _shipped_without(tmp_path: Path, field: str, row: int = 2) -> Path:
    from evalkit.paths import default_dataset_path

    rows = [json.loads(x) for x in default_dataset_path().read_text(encoding="utf-8").splitlines()[:4]]
    rows[row - 1].pop(field)
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_validate_names_the_row_that_lacks_a_field(runner, tmp_path):
    p = _shipped_without(tmp_path, "persona")
    assert f"{p}:2 (persona)" in runner.invoke(cli, ["dataset", "validate", str(p)]).output


def test_validate_keeps_the_grader_for_the_rows_that_have_the_field(runner, tmp_path):
    p = _shipped_without(tmp_path, "persona")
    assert "grader 'persona' grades 3 of 4 cases" in runner.invoke(cli, ["dataset", "validate", str(p)]).output


def test_a_grader_named_explicitly_with_rows_lacking_its_field_is_a_usage_error(tmp_path):
    from evalkit.errors import DatasetError
    from evalkit.spec.dataset import load_cases

    p = _shipped_without(tmp_path, "persona")
    with pytest.raises(DatasetError, match=rf"{p}:2 \(persona\)"):
        registry.choose(["persona"], load_cases(p), where=str(p))


def test_only_the_rows_with_the_field_are_graded(tmp_path):
    from evalkit.grading import GradedRequest
    from evalkit.grading.persona import PersonaGrader
    from evalkit.spec.dataset import load_cases

    cases = load_cases(_shipped_without(tmp_path, "persona"))
    items = [GradedRequest(i, "v", "text", "stop", c) for i, c in enumerate(cases)]
    assert [registry.can_grade(PersonaGrader, i.case) for i in items] == [True, False, True, True]


# --- report --by (issue 33, 4): quality per attribute value, n without the floor pass --------------


def test_report_by_shows_the_plugin_s_mean_per_value(runner, receipts):
    forget()
    out = runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--by", "difficulty,language",
                              "--markdown"]).output
    assert [x for x in out.splitlines() if x.startswith("| base | easy | de | 2 | 0 |") and "| 1.00 | 100 |" in x], out


def test_report_by_in_json_has_each_value_s_quality(runner, receipts):
    forget()
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--by", "difficulty",
                                         "--json"]).output)
    assert {(e["variant"], e["difficulty"]): e["fieldmatch_mean"] for e in rep["findings"]["by_quality"]} == {
        ("base", "easy"): 1.0, ("base", "hard"): 1.0, ("w8a8", "easy"): 1.0, ("w8a8", "hard"): 1.0}


def test_the_html_report_has_a_by_section(runner, receipts, tmp_path):
    forget()
    r = runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--by", "language", "--html",
                            str(tmp_path / "r.html")])
    assert "<h2>By language</h2>" in (tmp_path / "r.html").read_text(encoding="utf-8"), r.output


# --- only what serves (issue 33, 5) --------------------------------------------------------------


def _requests(ledger: Path, variant: str) -> int:
    db = open_ledger(ledger, create=False)
    return sum(r["variant"] == variant for r in db.measured_requests(db.require_run()["id"]))


def test_without_drift_the_baseline_is_sent_once(receipts):
    assert _requests(receipts[1], "base") == _requests(receipts[1], "w8a8")


def test_without_divergence_nothing_is_scored_teacher_forced(receipts):
    db = open_ledger(receipts[1], create=False)
    assert db.token_scores(db.require_run()["id"]) == []


def test_what_was_left_out_is_said():
    from evalkit.spec.matrix import load_matrix

    m = load_matrix(None)
    assert registry.serve_only(m, ["schema", "fieldmatch"]) == [
        "not sent: the baseline's second pass (drift's noise floor): drift is not among the graders (schema, "
        "fieldmatch)", "not sent: teacher-forced scoring of the baseline's answers on every server: divergence is "
        "not among the graders"]


def test_the_multiplicity_note_names_only_what_was_tested(runner, receipts):
    forget()
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--json"]).output)
    assert [n for n in rep["notes"] if "difference tests" in n and "drift" in n] == []


def test_with_drift_and_divergence_everything_is_sent():
    from evalkit.spec.matrix import load_matrix

    assert registry.serve_only(load_matrix(None), ["drift", "divergence"]) == []


# --- the stub rehearses a real schema (issue 33, 7) ------------------------------------------------


def test_the_stub_s_answers_pass_a_schema_with_a_pattern(runner, receipts):
    forget()
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(receipts[1]), "--json"]).output)
    assert {r["variant"]: r["schema_pass_pct"] for r in rep["rows"] if r["complexity"] == "all"} == {
        "base": 100.0, "w8a8": 100.0}


def test_the_stub_keeps_its_readable_answer_when_it_is_valid():
    from evalkit.testing.stub_text import answer_text

    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"reply": {"type": "string"}}}}}}
    assert json.loads(answer_text(body))["reply"].startswith("Stub answer for")


def test_a_generated_answer_is_the_same_every_time():
    from evalkit.testing.schema_instances import _generated

    schema = json.dumps({**SCHEMA, "properties": {**SCHEMA["properties"], "date": {"type": "string",
                                                                                       "format": "date"}}})
    first = _generated(schema)
    _generated.cache_clear()
    assert _generated(schema) == first


# stub_ledger's run last: a ledger held open through an in-process run was seen corrupted (reported)


def test_report_by_counts_no_noise_floor_pass(runner, stub_ledger):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--by", "persona",
                                         "--json"]).output)
    n = {v: sum(e["n"] for e in rep["findings"]["slices"] if e["variant"] == v) for v in ("base", "cand")}
    assert n["base"] == n["cand"]  # the run sent the baseline twice (baseline_repeats: 2)


def test_report_by_quality_has_flips_per_value(runner, stub_ledger):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--by", "persona",
                                         "--json"]).output)
    assert "schema" in rep["findings"]["by_quality"][-1]["flips"]


# --- docs from the code (issue 33, 6) ------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_plugins_md_lists_what_a_grader_receives_as_the_code_has_it():
    from evalkit.grading.inputs_doc import END, START, markdown

    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    assert text[text.index(START):text.index(END) + len(END)] == markdown()


def test_every_field_a_grader_receives_has_a_meaning():
    import dataclasses

    from evalkit.grading import GradedRequest
    from evalkit.spec.dataset import Case

    missing = [f.name for f in dataclasses.fields(GradedRequest) if not f.metadata.get("doc")]
    assert missing + [n for n, f in Case.model_fields.items() if not f.description] == []


def test_models_lists_every_bundled_model(runner):
    from evalkit.engines.bundled import BUNDLED

    out = runner.invoke(cli, ["models"]).output
    assert [n for n in BUNDLED if f"bundled:{n}:" not in out] == []


def test_workloads_md_names_every_bundled_model():
    from evalkit.engines.bundled import BUNDLED

    text = (ROOT / "docs" / "workloads.md").read_text(encoding="utf-8")
    assert [n for n in BUNDLED if f"`bundled:{n}`" not in text] == []


# --- messages made true (issue 33, 8) --------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint_down(tmp_path_factory):
    """A run whose candidate's endpoint is down, with margins in its matrix (down after the pre-run
    probe, which would refuse the run: the probe is bypassed to reach a run with a failed variant)."""
    import socket

    from click.testing import CliRunner

    tmp = tmp_path_factory.mktemp("issue33-down")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as a:
        m = tmp / "matrix.yaml"
        m.write_text(f"name: down\nbaseline: base\nmargins: {{e2e_mean: +10%}}\ngeneration: {{max_tokens: 16}}\n"
                     f"variants:\n  - name: base\n    endpoint: {a.base_url}\n  - name: cand\n    endpoint: {dead}\n")
        ledger = tmp / "down.db"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("evalkit.execution.skeleton.preflight", lambda matrix, **kw: None)
            ran = CliRunner().invoke(cli, ["run", "--matrix", str(m), "--limit", "3", "--ledger", str(ledger), "-q",
                                           "--no-grade"])
    return ledger, ran


def test_the_run_line_says_a_variant_failed(endpoint_down):
    assert "1 variant(s) failed: cand" in endpoint_down[1].output, endpoint_down[1].output


def test_no_verdict_does_not_claim_there_are_no_margins(runner, endpoint_down):
    out = runner.invoke(cli, ["report", "--ledger", str(endpoint_down[0]), "--markdown"]).output
    assert "verdict: none: the margins (e2e_mean=+10%) found no case" in out, out


def test_sigterm_to_browse_is_not_an_error(endpoint_down):
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen([sys.executable, str(root / "cli.py"), "browse", "--ledger", str(endpoint_down[0]), "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Datasette listening
        with socket.socket() as c:
            if c.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert (p.returncode, "Error" in err) == (143, False), out + err
