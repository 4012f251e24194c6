"""What a user reads is what was measured (issue 46): a workload of its own (examples/support: no
`complexity`, its own schema, a plugin grader) run through stubs; the terminal report (JSON), the
HTML report, the dataset card, the published summary and Datasette's derived summary give the same
n and pass rates per variant, the baseline's noise-floor pass counted in none of them."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.testing.stub_server import StubConfig, StubServer

pytestmark = pytest.mark.integration
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    from click.testing import CliRunner

    runner = CliRunner()
    tmp = tmp_path_factory.mktemp("agree")
    wl = tmp / "support"
    shutil.copytree(PROJECT / "examples" / "support", wl)
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0)) as a, StubServer(StubConfig(ttft_ms=3, itl_ms=0)) as b:
        text = (wl / "matrix.yaml").read_text()
        text = text.replace("http://127.0.0.1:8101", a.base_url).replace("http://127.0.0.1:8102", b.base_url)
        (wl / "matrix.yaml").write_text(text.replace("generation:\n", "generation:\n  baseline_repeats: 2\n", 1))
        ledger = tmp / "l.db"
        r = runner.invoke(cli, ["run", "--workload", str(wl), "--ledger", str(ledger), "-q"])
        assert r.exit_code == 0, r.output
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger), "--json"]).output)
    html = tmp / "r.html"
    assert runner.invoke(cli, ["report", "--ledger", str(ledger), "--html", str(html)]).exit_code == 0
    out = tmp / "pub"
    assert runner.invoke(cli, ["publish", "--ledger", str(ledger), "--out", str(out)]).exit_code == 0
    return {"report": rep, "html": html.read_text(), "card": (out / "README.md").read_text(), "pub": out,
            "ledger": ledger}


def terminal_n(rep: dict, variant: str) -> int:
    return next(r["n"] for r in rep["rows"] if r["variant"] == variant and r["complexity"] == "all")


def terminal_schema(rep: dict, variant: str) -> float:
    return next(r["schema_pass_pct"] for r in rep["rows"] if r["variant"] == variant and r["complexity"] == "all")


@pytest.mark.parametrize("variant", ["current", "candidate"])
def test_the_summary_counts_what_the_tables_count(outputs, variant):
    study = next(s for s in outputs["report"]["findings"]["study_summary"] if s["variant"] == variant)
    assert study["n"] == terminal_n(outputs["report"], variant)


def test_the_baseline_is_counted_once_not_with_its_noise_floor_pass(outputs):
    assert terminal_n(outputs["report"], "current") == terminal_n(outputs["report"], "candidate")


@pytest.mark.parametrize("variant", ["current", "candidate"])
def test_the_published_summary_has_the_same_n(outputs, variant):
    import pyarrow.parquet as pq

    rows = pq.read_table(outputs["pub"] / "summary" / "data.parquet").to_pylist()
    assert next(r["n"] for r in rows if r["variant"] == variant) == terminal_n(outputs["report"], variant)


@pytest.mark.parametrize("variant", ["current", "candidate"])
def test_datasettes_derived_summary_has_the_same_n(outputs, variant):
    with sqlite3.connect(outputs["ledger"]) as c:
        got = {json.loads(j)["variant"]: json.loads(j)["n"] for (j,) in c.execute("select json from derived_summary")}
    assert got[variant] == terminal_n(outputs["report"], variant)


@pytest.mark.parametrize("page", ["html", "card"])
@pytest.mark.parametrize("variant", ["current", "candidate"])
def test_every_page_shows_the_same_n_and_schema_rate(outputs, page, variant):
    n, rate = terminal_n(outputs["report"], variant), terminal_schema(outputs["report"], variant)
    text = re.sub(r"<[^>]+>", "|", outputs[page])
    assert re.search(rf"{variant}( \(baseline\))?\s*\|+\s*{n}\s*\|.*\|\s*{rate:.0f}\s*\|", text), (variant, n, rate)


@pytest.mark.parametrize("page", ["html", "card"])
def test_no_summary_shows_a_complexity_the_workload_does_not_have(outputs, page):
    # the summary table's header row (the card's definitions list may still name every column)
    text = re.sub(r"<t[hd]>", "| ", outputs[page])
    headers = [line for line in re.split(r"\n|<tr>", text) if line.lstrip().startswith("| variant |")]
    assert [h for h in headers if "TTFT tax short" in h] == []


def test_the_published_summary_has_no_empty_column(outputs):
    import pyarrow.parquet as pq

    rows = pq.read_table(outputs["pub"] / "summary" / "data.parquet").to_pylist()
    assert [k for k in rows[0] if all(r[k] is None for r in rows)] == []


def test_published_cases_leave_out_the_warm_ups(outputs):
    import pyarrow.parquet as pq

    ids = pq.read_table(outputs["pub"] / "cases" / "data.parquet").column("id").to_pylist()
    assert [i for i in ids if i.startswith("_warmup")] == []
