"""Your workload, not ours: docs/workloads.md followed step by step (init, validate, run, report,
check) on a support workload with no resume field, its own schema file, two endpoints and a grader
in a local module — no dummy field, no copied rubric, no package install; and the generic case
format's rules on their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.errors import DatasetError
from evalkit.grading import registry
from evalkit.spec.dataset import load_cases
from evalkit.spec.workload import scaffold
from evalkit.testing.stub_server import StubConfig, StubServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """Steps 1 and 4 of the tutorial: scaffold, point the matrix at two live endpoints, run."""
    from click.testing import CliRunner

    runner = CliRunner()
    tmp_path = tmp_path_factory.mktemp("tutorial")
    folder = tmp_path / "my-support"
    r = runner.invoke(cli, ["init", str(folder)])
    assert r.exit_code == 0, r.output
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=40, itl_ms=1)) as b:
        m = folder / "matrix.yaml"
        m.write_text(m.read_text().replace("http://127.0.0.1:8101", a.base_url)
                     .replace("http://127.0.0.1:8102", b.base_url), encoding="utf-8")
        validated = runner.invoke(cli, ["dataset", "validate", "--workload", str(folder)])
        ledger = tmp_path / "support.db"
        ran = runner.invoke(cli, ["run", "--workload", str(folder), "--ledger", str(ledger)])
    yield folder, ledger, validated, ran
    registry._LOCAL.pop("replylen", None)
    sys.modules.pop("replylen", None)
    registry.available.cache_clear()


def test_init_writes_the_workload_the_tutorial_describes(workload):
    folder = workload[0]
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "dataset.jsonl", "matrix.yaml", "replylen.py",
                                                         "schemas"]


def test_its_cases_carry_no_resume_field(workload):
    rows = [json.loads(x) for x in (workload[0] / "dataset.jsonl").read_text().splitlines()]
    assert not {"persona", "candidate", "formality", "context_keys", "task"} & {k for r in rows for k in r}


def test_validate_says_which_graders_the_cases_feed(workload):
    assert "graders: schema, drift, replylen" in workload[2].output


def test_the_run_succeeds(workload):
    assert workload[3].exit_code == 0, workload[3].output


def test_the_run_ends_with_a_verdict(workload):
    assert "verdict: candidate vs current:" in workload[3].output


@pytest.mark.integration
def test_only_the_graders_that_apply_ran(runner, workload):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(workload[1]), "--json"]).output)
    assert rep["graders"] == ["drift", "replylen", "schema"]


@pytest.mark.integration
def test_its_own_schema_file_checked_every_answer(runner, workload):
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(workload[1]), "--json"]).output)
    assert {r["variant"]: r["schema_pass_pct"] for r in rep["rows"]} == {"current": 100.0, "candidate": 100.0}


@pytest.mark.integration
def test_the_report_slices_by_an_attribute(runner, workload):
    out = runner.invoke(cli, ["report", "--ledger", str(workload[1]), "--by", "category", "--markdown"]).output
    assert "| current | billing |" in out


@pytest.mark.integration
def test_check_gates_on_the_matrix_s_margins(runner, workload):
    r = runner.invoke(cli, ["check", "--ledger", str(workload[1])])
    assert "FAIL candidate: e2e_mean: inferior" in r.output  # 40 ms against 2 ms: far past +10 %


@pytest.mark.integration
def test_the_html_report_builds(runner, workload, tmp_path):
    r = runner.invoke(cli, ["report", "--ledger", str(workload[1]), "--html", str(tmp_path / "r.html")])
    assert "reply words" in (tmp_path / "r.html").read_text(encoding="utf-8"), r.output


def test_the_shipped_example_is_what_init_writes(tmp_path):
    scaffold(tmp_path / "w")
    shipped = ROOT / "examples" / "support"
    for p in (tmp_path / "w").rglob("*"):
        if p.is_file():
            assert p.read_text() == (shipped / p.relative_to(tmp_path / "w")).read_text(), p.name


def _cases(tmp_path: Path, rows: list[dict], schema: dict | None = None) -> Path:
    if schema is not None:
        (tmp_path / "schemas").mkdir(exist_ok=True)
        (tmp_path / "schemas" / "mine.schema.json").write_text(json.dumps(schema))
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


MSG = [{"role": "user", "content": "hi"}]


def test_a_case_needs_only_an_id_and_messages(tmp_path):
    assert load_cases(_cases(tmp_path, [{"id": "a", "messages": MSG}]))[0].attributes == {}


def test_every_other_field_is_an_attribute(tmp_path):
    c = load_cases(_cases(tmp_path, [{"id": "a", "messages": MSG, "category": "billing", "priority": 2}]))[0]
    assert c.attributes == {"category": "billing", "priority": 2}


@pytest.mark.parametrize("schema", ["mine", "schemas/mine.schema.json", {"type": "object"}])
def test_a_schema_is_a_name_a_path_or_inline(tmp_path, schema):
    p = _cases(tmp_path, [{"id": "a", "messages": MSG, "schema": schema}], {"type": "object"})
    assert load_cases(p, tmp_path / "schemas")[0].schema_doc == {"type": "object"}


def test_an_unknown_schema_names_the_line_and_what_is_known(tmp_path):
    p = _cases(tmp_path, [{"id": "a", "messages": MSG}, {"id": "b", "messages": MSG, "schema": "nope"}])
    with pytest.raises(DatasetError, match=r"d.jsonl:2: field 'schema': unknown schema 'nope' \(known: .*outreach_email"):
        load_cases(p)


def test_a_grader_whose_fields_are_missing_is_skipped_with_one_line(tmp_path):
    cases = load_cases(_cases(tmp_path, [{"id": "a", "messages": MSG}]))
    names, notes = registry.choose(None, cases)
    assert "persona" not in names
    assert any(n.startswith("grader 'persona' skipped: 1 of 1 cases lack task, persona") for n in notes)


def test_a_bad_attribute_a_grader_reads_names_its_line_and_field(tmp_path):
    cases = load_cases(_cases(tmp_path, [{"id": "a", "messages": MSG, "formality": "formal"}]))
    with pytest.raises(DatasetError, match=r"d.jsonl:1: field 'formality': .*grader 'formality'"):
        registry.choose(["formality"], cases, where=str(tmp_path / "d.jsonl"))


def test_the_shipped_workload_keeps_its_graders():
    names, notes = registry.choose(None, load_cases())
    assert names == ["schema", "persona", "formality", "drift", "load_drift", "divergence"]


# --- check_case as docs/plugins.md writes it (issue 46) ------------------------------------------------------

PRIORITY = """from evalkit.grading import Grader, Score


class Priority(Grader):
    name = "priority"
    version = "1"
    default = False
    requires = ("priority",)

    def check_case(self, case):
        {body}

    def grade(self, item):
        return Score(1.0, True, "ok")
"""
CHECKS = {"plain method": 'return None if self.name and case.get("priority") in ("low", "high") '
                          'else "priority: expected low or high"',
          "raising": 'return {"low": None}[case.get("priority")]'}


def _priority_workload(folder: Path, body: str, bad: int) -> Path:
    """A workload whose grader's `check_case` is a plain method; ``bad`` rows of 30 it refuses."""
    folder.mkdir()
    (folder / "priority_mod.py").write_text(PRIORITY.format(body=CHECKS[body]))
    rows = [{"id": f"c{i}", "messages": MSG, "priority": "urgent" if i < bad else "low"} for i in range(30)]
    (folder / "dataset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "matrix.yaml").write_text("name: p\nbaseline: a\ngraders: [priority_mod:Priority]\n"
                                        "variants: [{name: a, endpoint: 'http://127.0.0.1:9'}]\n")
    return folder


@pytest.fixture
def forgets_priority():
    yield
    for d in (registry._LOCAL, registry._ROOTS, registry._ORIGIN):
        d.pop("priority", None)
    sys.modules.pop("priority_mod", None)
    sys.path[:] = [p for p in sys.path if "prio-" not in p]
    registry.available.cache_clear()


def _validate(runner, folder: Path):
    return runner.invoke(cli, ["dataset", "validate", "--workload", str(folder)])


def test_a_plain_method_check_case_passes_good_rows(runner, tmp_path, forgets_priority):
    r = _validate(runner, _priority_workload(tmp_path / "prio-ok", "plain method", 0))
    assert "graders: priority" in r.output, r.output


def test_a_plain_method_check_case_refuses_with_exit_2(runner, tmp_path, forgets_priority):
    assert _validate(runner, _priority_workload(tmp_path / "prio-bad", "plain method", 3)).exit_code == 2


def test_every_refused_row_is_named_by_file_and_line(runner, tmp_path, forgets_priority):
    folder = _priority_workload(tmp_path / "prio-bad", "plain method", 3)
    out = _validate(runner, folder).output
    named = [f"{folder / 'dataset.jsonl'}:{i}: field 'priority': expected low or high" for i in (1, 2, 3)]
    assert [x for x in named if x in out] == named


def test_refused_rows_beyond_twenty_are_counted(runner, tmp_path, forgets_priority):
    out = _validate(runner, _priority_workload(tmp_path / "prio-many", "plain method", 25)).output
    assert out.strip().endswith("(grader 'priority' reads them); +5 more"), out


@pytest.mark.parametrize("fact", ["one line", "names the grader and hook", "names the row", "no traceback", "exit 2"])
def test_a_raising_hook_is_one_line(runner, tmp_path, forgets_priority, fact):
    folder = _priority_workload(tmp_path / "prio-raise", "raising", 2)
    r = _validate(runner, folder)
    checks = {"one line": lambda: len(r.output.strip().splitlines()) == 1,
              "names the grader and hook": lambda: "grader 'priority': its hook `check_case` raised KeyError" in r.output,
              "names the row": lambda: f"(on {folder / 'dataset.jsonl'}:1)" in r.output,
              "no traceback": lambda: isinstance(r.exception, SystemExit | None),
              "exit 2": lambda: r.exit_code == 2}
    assert checks[fact](), r.output


# --- default_schema (issue 46) -----------------------------------------------------------------------------


def _schema_cases(tmp_path: Path, default: object) -> list:
    from evalkit.spec.matrix import Matrix

    p = _cases(tmp_path, [{"id": "a", "messages": MSG}, {"id": "b", "messages": MSG, "schema": {"type": "array"}}],
               {"type": "object"})
    m = Matrix.model_validate({"name": "m", "baseline": "x", "default_schema": default,
                               "variants": [{"name": "x", "endpoint": "http://127.0.0.1:1"}]})
    m._folder = tmp_path
    return m.load_cases(p)


@pytest.mark.parametrize("default", ["mine", "schemas/mine.schema.json", {"type": "object"}])
def test_default_schema_applies_to_a_case_that_names_none(tmp_path, default):
    assert _schema_cases(tmp_path, default)[0].schema_doc == {"type": "object"}


def test_a_case_s_own_schema_wins_over_the_default(tmp_path):
    assert _schema_cases(tmp_path, "mine")[1].schema_doc == {"type": "array"}


def test_an_unknown_default_schema_names_the_matrix_field(tmp_path):
    with pytest.raises(DatasetError, match=r"matrix field 'default_schema': unknown schema 'nope' \(known: .*mine"):
        _schema_cases(tmp_path, "nope")


def test_validate_feeds_the_schema_grader_from_the_default_schema(runner, tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    _cases(folder, [{"id": "a", "messages": MSG}], {"type": "object"}).rename(folder / "dataset.jsonl")
    (folder / "matrix.yaml").write_text("name: w\nbaseline: x\ndefault_schema: mine\n"
                                        "variants: [{name: x, endpoint: 'http://127.0.0.1:1'}]\n")
    assert "graders: schema" in runner.invoke(cli, ["dataset", "validate", "--workload", str(folder)]).output


# --- --workload DIR --matrix FILE (issue 46) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def other_matrix_run(tmp_path_factory):
    """The scaffolded workload run under another matrix from elsewhere (its own name, margins, stubs)."""
    from click.testing import CliRunner
    from sqlite_utils import Database

    tmp = tmp_path_factory.mktemp("other-matrix")
    folder = tmp / "my-support"
    scaffold(folder)
    with StubServer(StubConfig(ttft_ms=2, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=4, itl_ms=1)) as b:
        other = tmp / "elsewhere" / "gpu.yaml"
        other.parent.mkdir()
        other.write_text(f"name: gpu\nbaseline: one\nmargins: {{e2e_mean: +50%}}\ngeneration: {{max_tokens: 64}}\n"
                         f"variants:\n  - name: one\n    endpoint: {a.base_url}\n  - name: two\n    endpoint: {b.base_url}\n")
        r = CliRunner().invoke(cli, ["run", "--workload", str(folder), "--matrix", str(other), "--ledger",
                                     str(tmp / "l.db"), "--limit", "4", "-q"])
    yield r, folder, next(Database(tmp / "l.db")["runs"].rows)
    for d in (registry._LOCAL, registry._ROOTS, registry._ORIGIN):
        d.pop("replylen", None)
    sys.modules.pop("replylen", None)
    registry.available.cache_clear()


def test_a_workload_runs_under_another_matrix(other_matrix_run):
    assert other_matrix_run[0].exit_code == 0, other_matrix_run[0].output


def test_the_other_matrix_is_the_run_s(other_matrix_run):
    assert other_matrix_run[2]["matrix_name"] == "gpu"


def test_the_workload_s_cases_are_the_run_s(other_matrix_run):
    assert other_matrix_run[2]["dataset_path"] == str((other_matrix_run[1] / "dataset.jsonl").resolve())


def test_the_workload_s_graders_are_the_run_s(other_matrix_run):
    assert "replylen:ReplyLength" in other_matrix_run[2]["graders_json"]
