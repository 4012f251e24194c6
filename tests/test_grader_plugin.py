"""A grader from another installed package (entry point `evalkit.graders`) shows up in the
report, the HTML, Datasette's view and the dataset card with no edit to evalkit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.grading import registry

PLUGIN = Path(__file__).parent / "plugins" / "evalkit-wordcount"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """pip-installs the test plugin into its own folder and puts that folder on sys.path."""
    site = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src") / PLUGIN.name
    shutil.copytree(PLUGIN, src)  # a build leaves files behind: build from a copy, not the repo
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True)
    sys.path.insert(0, str(site))
    registry.available.cache_clear()
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("evalkit_wordcount", None)
    registry.available.cache_clear()


def test_plugin_is_registered(plugin_site, runner):
    assert "wordcount" in registry.available()
    assert "wordcount" not in registry.default_names()  # it declared default = False
    r = runner.invoke(cli, ["graders", "list"])
    assert r.exit_code == 0
    assert "wordcount v1 (request)" in r.output
    assert "schema v1 (request, default)" in r.output
    assert "threshold wordcount_mean (max)" in r.output
    assert "canned query longest_outputs" in r.output


def test_plugin_grades_reach_report_html_datasette_and_card(plugin_site, runner, stub_ledger, tmp_path):
    r = runner.invoke(cli, ["grade", "--grader", "wordcount", "--ledger", str(stub_ledger)])
    assert r.exit_code == 0, r.output
    assert "new grades" in r.output, r.output
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(stub_ledger)]).output)
    assert "wordcount" in rep["graders"]
    row = next(x for x in rep["rows"] if x["variant"] == "base" and x["complexity"] == "all")
    assert row["wordcount_mean"] > 0
    assert row["wordcount_short_pct"] is not None
    # a threshold in the gate, and a margin, with no line of evalkit naming the grader
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "wordcount_mean=1"])
    assert r.exit_code == 1, r.output
    assert "FAIL base: wordcount_mean" in r.output, r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "wordcount_mean=1000",
                            "--margins", "wordcount=5"])
    assert r.exit_code == 0, r.output
    # two thresholds pass; the margin (the candidate) is undecided: 6 pairs cannot decide 2 hypotheses
    assert "2 passed, 0 failed, 1 undecided" in r.output, r.output
    r = runner.invoke(cli, ["check", "--ledger", str(stub_ledger), "--threshold", "wordcount_mean=1000",
                            "--margins", "wordcount=5", "--require-decided"])
    assert r.exit_code == 1, r.output
    md = runner.invoke(cli, ["report", "--markdown", "--ledger", str(stub_ledger)]).output
    assert "| words |" in md
    assert "≤120 words %" in md

    html = tmp_path / "r.html"
    assert runner.invoke(cli, ["report", "--html", str(html), "--ledger", str(stub_ledger)]).exit_code == 0
    assert "≤120 words %" in html.read_text(encoding="utf-8")

    out = tmp_path / "ds"
    assert runner.invoke(cli, ["publish", "--out", str(out), "--ledger", str(stub_ledger)]).exit_code == 0
    assert "≤120 words %" in (out / "README.md").read_text(encoding="utf-8")

    from evalkit.ledger import open_ledger
    from evalkit.sharing.browse import browse

    from .test_findings import _free_port, wait_for_json

    port = _free_port()
    p = browse(open_ledger(stub_ledger), stub_ledger, "127.0.0.1", port, meta_dir=tmp_path, wait=False)
    try:
        rows = wait_for_json(f"http://127.0.0.1:{port}/{stub_ledger.stem}/requests_joined.json?_shape=array&_size=50")
        assert isinstance(rows, list)
        assert rows
        assert all("word_count" in x for x in rows)
        assert any(x["word_count"] for x in rows if x["is_warmup"] == 0)
        longest = wait_for_json(f"http://127.0.0.1:{port}/{stub_ledger.stem}/longest_outputs.json?_shape=array")
        assert longest
        assert longest[0]["word_count"] == max(x["word_count"] for x in rows if x["is_warmup"] == 0)
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_the_built_ins_need_no_entry_points(monkeypatch):
    """A checkout on PYTHONPATH (no installed entry points) still has every built-in grader."""
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    registry.available.cache_clear()
    try:
        assert set(registry.BUILTINS) <= set(registry.available())
    finally:
        registry.available.cache_clear()


def test_a_grader_in_a_local_module_registers_by_module_and_class(tmp_path, monkeypatch):
    (tmp_path / "charlen.py").write_text(
        "from evalkit.grading import Grader, Score\n\n"
        "class CharLength(Grader):\n    name = 'charlen'\n    version = '1'\n    default = False\n\n"
        "    def grade(self, item):\n        return Score(float(len(item.text)), None, 'chars')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert registry.resolve(["charlen:CharLength"]) == ["charlen"]
        assert "charlen" in registry.available()
    finally:
        registry._LOCAL.pop("charlen", None)
        sys.modules.pop("charlen", None)
        registry.available.cache_clear()


def test_an_unknown_grader_says_how_to_register_one():
    from evalkit.errors import UsageError

    with pytest.raises(UsageError, match="module:Class"):
        registry.resolve(["nope"])
