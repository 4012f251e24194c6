"""The report is one typed document: sections (a title and its blocks) that the terminal, Markdown,
HTML and the dataset card each render with one loop. A section added in one place is in all four."""

from __future__ import annotations

import pytest

from evalkit.cli import cli
from evalkit.reporting import document
from evalkit.reporting.document import Section, Table

pytestmark = pytest.mark.integration


def _marker_section(report, fnd, by):  # noqa: ANN001, ANN202
    return Section("marker", "Marker section", ["marker line 7f3a",
                                                Table("marker table", ["variant", "x"], [["base", "42.5"]], 1)])


@pytest.fixture
def with_marker(monkeypatch):
    monkeypatch.setattr(document, "SECTIONS", [*document.SECTIONS, _marker_section])


def test_a_section_added_in_one_place_is_in_the_terminal(runner, stub_ledger, with_marker):
    out = runner.invoke(cli, ["report", "--ledger", str(stub_ledger)]).output
    assert "marker line 7f3a" in out


def test_a_section_added_in_one_place_is_in_the_markdown(runner, stub_ledger, with_marker):
    out = runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--markdown"]).output
    assert "| base | 42.5 |" in out


def test_a_section_added_in_one_place_is_in_the_html(runner, stub_ledger, with_marker, tmp_path):
    page = tmp_path / "r.html"
    assert runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--html", str(page)]).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert "<h2>Marker section</h2>" in html
    assert "<td>42.5</td>" in html


def test_a_section_added_in_one_place_is_in_the_card(runner, stub_ledger, with_marker, tmp_path):
    r = runner.invoke(cli, ["publish", "--ledger", str(stub_ledger), "--out", str(tmp_path / "pub")])
    assert r.exit_code == 0, r.output
    card = (tmp_path / "pub" / "README.md").read_text(encoding="utf-8")
    assert "## Marker section" in card
    assert "marker line 7f3a" in card


@pytest.mark.parametrize("title", ["Latency (ms)", "What the server did (ms)", "Quality", "Spikes", "Verdicts"])
def test_the_html_has_every_section_the_terminal_has(runner, stub_ledger, tmp_path, title):
    page = tmp_path / "r.html"
    assert runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--html", str(page)]).exit_code == 0
    assert f"<h2>{title}</h2>" in page.read_text(encoding="utf-8")
