"""The docs stay true to the code: the CLI reference is current, the README stays short and
starts with its two commands, every relative link resolves, and each definition has one home."""

from __future__ import annotations

import re
from pathlib import Path

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
    assert commands[0].startswith("make run") and commands[1].startswith("make test")


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
            assert "| **TTFT** |" not in text and "| **noise floor** |" not in text, page.name
