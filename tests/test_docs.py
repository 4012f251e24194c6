"""The docs stay true to the code: the CLI reference is current, the README stays short and
starts with its two commands, every relative link resolves, and each definition has one home."""

from __future__ import annotations

import inspect
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


def _documented_signatures() -> list[tuple[str, str, tuple[str, ...]]]:
    """(Grader|Aggregate, hook, its parameters) as docs/plugins.md's hook tables write them."""
    doc = (DOCS / "plugins.md").read_text(encoding="utf-8")
    grader_table = doc.split("**`Grader`** (scoring)", 1)[1].split("\n\n")[1]
    aggregate_table = doc.split("**`Aggregate`**", 1)[1].split("\n\n")[1]
    out = []
    for kind, table in (("Grader", grader_table), ("Aggregate", aggregate_table)):
        for name, params in re.findall(r"^\| `(\w+)\(([^)]*)\)` \|", table, re.M):
            out.append((kind, name, tuple(p.strip() for p in params.split(",") if p.strip())))
    return out


DOCUMENTED = _documented_signatures()
INSTANCE_HOOKS = {"grade", "grade_batch", "grade_outputs"}  # called on the grader from_context built


def _code_params(kind: str, name: str) -> tuple[str, ...]:
    import evalkit.grading as g

    return tuple(p for p in inspect.signature(getattr(getattr(g, kind), name)).parameters if p not in ("self", "cls"))


@pytest.mark.parametrize("kind", ["Grader", "Aggregate"])
def test_every_method_hook_has_its_signature_in_the_plugin_tutorial(kind):
    import evalkit.grading as g

    cls = getattr(g, kind)
    methods = {h for h in _hooks(cls) if inspect.isroutine(getattr(cls, h, None))}
    assert methods == {name for k, name, _ in DOCUMENTED if k == kind}


@pytest.mark.parametrize(("kind", "name", "params"), DOCUMENTED, ids=[f"{k}.{n}" for k, n, _ in DOCUMENTED])
def test_the_plugin_tutorial_gives_each_hooks_exact_parameters(kind, name, params):
    assert params == _code_params(kind, name)


RETURNS = {"check_case": "None", "from_context": "DocGrader()", "grade": "Score(1.0, True, 'ok')",
           "grade_batch": "[Score(1.0, True, 'ok') for _ in items]", "grade_outputs": "{}",
           "validate_rubrics": "None", "calibrate": "{'n': 0}", "calibration_lines": "['n 0']",
           "headline_keys": "()", "summarise": "{}", "summary_sql": "None", "summary_from_cases": "None",
           "margin_values": "{}", "case_values": "None",
           "notes": "[]"}


def _plugin(style: str) -> type:
    """A grader whose every hook is written as docs/plugins.md gives it: as plain methods (the
    instance hooks always), or the class-level ones as classmethods."""
    src = ["from evalkit.grading import Aggregate, Grader, Score", ""]
    for kind in ("Aggregate", "Grader"):
        src.append(f"class Doc{kind}({kind}):")
        src += ['    name = "doc"', '    version = "1"'] if kind == "Grader" else []
        src += ["    aggregate = DocAggregate"] if kind == "Grader" else []
        for k, name, params in DOCUMENTED:
            if k == kind:
                first = "cls" if style == "classmethod" and name not in INSTANCE_HOOKS else "self"
                src += ["    @classmethod"] if first == "cls" else []
                src += [f"    def {name}({', '.join([first, *params])}):", f"        return {RETURNS[name]}"]
    ns: dict = {}
    exec("\n".join(src), ns)  # noqa: S102 - the test's own source, from the doc's signatures
    return ns["DocGrader"]


def _args(params: tuple[str, ...]) -> list:
    from evalkit.grading import GradedRequest, GraderContext
    from evalkit.spec.dataset import Case

    case = Case.model_validate({"id": "c", "messages": [{"role": "user", "content": "hi"}]})
    item = GradedRequest(1, "base", "an answer", "stop", case)
    sample = {"case": case, "ctx": GraderContext(), "item": item, "items": [item], "repeats": {1: 0}, "baseline": "base",
              "rubrics": DOCS, "path": None, "result": {"n": 0}, "grades": [], "base_grades": None,
              "baseline_side": False, "rows": [], "mine": None, "base": {}}
    return [sample[p] for p in params]


@pytest.mark.parametrize("style", ["method", "classmethod"])
@pytest.mark.parametrize(("kind", "name", "params"), DOCUMENTED, ids=[f"{k}.{n}" for k, n, _ in DOCUMENTED])
def test_each_documented_hook_is_called_as_the_tutorial_writes_it(kind, name, params, style):
    from evalkit.grading import GraderContext, Score
    from evalkit.grading.base import hook

    cls = _plugin(style)
    if name in INSTANCE_HOOKS:
        got = getattr(hook(cls, "from_context", GraderContext()), name)(*_args(params))
    else:
        got = hook(cls, name, *_args(params))
    if name == "from_context":
        assert isinstance(got, cls)
    else:
        assert got == eval(RETURNS[name], {"Score": Score, "items": _args(("items",))[0]})  # noqa: S307


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
