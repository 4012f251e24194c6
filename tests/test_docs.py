"""The docs stay true to the code: the CLI reference is current, the README stays short and
starts with its two commands, every relative link resolves, and each definition has one home."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalkit.cli.reference import render

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_cli_reference_matches_the_commands():
    committed = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert committed == render(), "docs/cli.md is stale: python -m evalkit.cli.reference > docs/cli.md"


def test_readme_is_short_and_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [x for x in first_block.group(1).splitlines() if x.strip() and not x.startswith("#")]
    assert commands[0].startswith("make run")
    assert commands[1].startswith("make test")


def test_every_relative_link_resolves():
    broken = []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_each_definition_lives_in_measuring_md_once():
    doc = (DOCS / "measuring.md").read_text(encoding="utf-8")
    for term in ("TTFT", "ITL", "TPOT", "E2E", "drift", "noise floor"):
        assert doc.count(f"| **{term}** |") == 1, term  # one row of a definitions table
    for page in DOCS.glob("*.md"):
        if page.name != "measuring.md":
            text = page.read_text(encoding="utf-8")
            assert "| **TTFT** |" not in text, page.name
            assert "| **noise floor** |" not in text, page.name


def _hooks(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))


@pytest.mark.parametrize("kind", ["Grader", "Aggregate"])
def test_every_grader_hook_is_documented_in_the_plugin_tutorial(kind):
    import evalkit.grading as g

    doc = (DOCS / "plugins.md").read_text(encoding="utf-8")
    missing = sorted(h for h in _hooks(getattr(g, kind)) if f"`{h}" not in doc)
    assert not missing, f"docs/plugins.md does not document {kind} hooks: {missing}"


def test_the_plugin_tutorial_imports_only_from_evalkit_grading():
    doc = (DOCS / "plugins.md").read_text(encoding="utf-8")
    imports = set(re.findall(r"^from (evalkit[\w.]*) import", doc, re.M))
    assert imports == {"evalkit.grading"}


def test_the_versions_agree():
    import tomllib

    import evalkit

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["version"] == evalkit.__version__


def test_the_columns_table_in_measuring_md_is_generated_from_the_catalogue():
    from evalkit.catalogue import definitions_markdown

    doc = (DOCS / "measuring.md").read_text(encoding="utf-8")
    block = doc.split("<!-- metrics:begin -->\n")[1].split("<!-- metrics:end -->")[0]
    assert block == definitions_markdown(), "regenerate the block from evalkit.catalogue.definitions_markdown()"
