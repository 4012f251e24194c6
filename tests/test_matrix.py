from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.cli import cli
from evalkit.errors import MatrixError
from evalkit.paths import PROJECT_DIR
from evalkit.spec.matrix import load_matrix


def test_default_matrix_is_base_vs_w8a8_in_the_native_dtype():
    m = load_matrix()
    assert m.baseline == "base"
    assert [v.name for v in m.ordered_variants()] == ["base", "w8a8"]
    assert all(v.dtype == "native" for v in m.variants)  # the dtype is a recorded fact, not the name
    assert all(v.launched and v.model and v.model.startswith("bundled:") for v in m.variants)
    assert m.generation.structured_output


@pytest.mark.parametrize("name", sorted(p.name for p in (PROJECT_DIR / "examples").glob("*.yaml")))
def test_example_matrices_validate(name):
    m = load_matrix(PROJECT_DIR / "examples" / name)
    assert m.baseline in {v.name for v in m.variants}


def test_gpu_example_passes_vllm_args_verbatim():
    m = load_matrix(PROJECT_DIR / "examples" / "gemma2-9b-bf16-vs-fp8.yaml")
    assert m.variant("fp8").vllm_args[:2] == ["--quantization", "fp8"]


GOOD = """name: t
baseline: a
variants:
  - name: a
    model: some/model
  - name: b
    model: some/model
    vllm_args: [--quantization, fp8]
"""


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD.replace("name: t", "name: t\ncolour: red"), ":2: field 'colour': unknown key"),
        (GOOD.replace("baseline: a", "baseline: z"), "baseline 'z' is not one of the variants"),
        (GOOD.replace("- name: b", "- name: a"), "duplicate variant name 'a'"),
        (GOOD.replace("model: some/model\n  - name: b", "endpoint: ftp://x\n  - name: b"),
         ":5: field 'variants.0.endpoint': not an http(s) URL"),
        (GOOD.replace("    vllm_args", "    engine: tgi\n    vllm_args"), ":8: field 'variants.1.engine'"),
        (GOOD.replace("baseline: a\n", ""), "field 'baseline': Field required"),
        (GOOD.replace("    model: some/model\n  - name: b", "  - name: b"), "give a model to launch or an endpoint"),
        (GOOD + "generation:\n  max_tokens: 0\n", ":10: field 'generation.max_tokens'"),
        ("name: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", ":1: a matrix must be a YAML mapping"),
        (GOOD.replace("model: some/model\n  - name: b", "endpoint: http://u:p@h\n  - name: b"),
         "credentials"),
        (GOOD.replace("    vllm_args", "    api_key_env: sk-live-123\n    vllm_args"),
         "NAME of an environment variable"),
    ],
)
def test_bad_matrix_names_line_and_field(tmp_path: Path, text: str, expected: str):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    with pytest.raises(MatrixError) as e:
        load_matrix(p)
    msg = str(e.value)
    assert msg.startswith(str(p)), msg
    assert expected in msg, msg
    assert "\n" not in msg


# --- what --resume lets a matrix change (issue 46) -----------------------------------------------------------


def _m(**cand: object) -> object:
    from evalkit.spec.matrix import Matrix

    c = {"name": "cand", "endpoint": "http://a:1", **cand}
    return Matrix.model_validate({"name": "m", "baseline": "base", "variants": [
        {"name": "base", "endpoint": "http://base:1"}, {k: v for k, v in c.items() if v is not None}]})


@pytest.mark.parametrize(("change", "line"), [
    ({"endpoint": "http://b:2"}, "resume: cand endpoint http://a:1 → http://b:2"),
    ({"api_key_env": "MY_KEY"}, "resume: cand api key env None → MY_KEY"),
])
def test_resume_takes_a_changed_endpoint_and_says_so(change, line):
    from evalkit.execution.resume import endpoint_changes

    assert endpoint_changes("r1", _m(), _m(**change)) == [line]


def test_resume_puts_the_new_endpoint_on_the_run_s_matrix():
    from evalkit.execution.resume import endpoint_changes

    stored = _m()
    endpoint_changes("r1", stored, _m(endpoint="http://b:2"))
    assert stored.variant("cand").endpoint == "http://b:2"


@pytest.mark.parametrize(("given", "field"), [
    (_m(served_model_name="other"), "variants.cand.served_model_name"),
    (_m(endpoint=None, model="/m"), "variants.cand.model"),
])
def test_resume_refuses_any_other_difference_naming_the_field(given, field):
    from evalkit.errors import UsageError
    from evalkit.execution.resume import endpoint_changes

    with pytest.raises(UsageError, match=f"field '{field}'"):
        endpoint_changes("r1", _m(), given)


def test_resume_refuses_other_variants():
    from evalkit.errors import UsageError
    from evalkit.execution.resume import endpoint_changes
    from evalkit.spec.matrix import Matrix

    other = Matrix.model_validate({"name": "m", "baseline": "base", "variants": [
        {"name": "base", "endpoint": "http://base:1"}, {"name": "cand2", "endpoint": "http://a:1"}]})
    with pytest.raises(UsageError, match="variants"):
        endpoint_changes("r1", _m(), other)


# --- matrix validate checks margins as run does; matrix show (issue 46) ----------------------------------------

TWO = "name: x\nbaseline: a\nmargins: {{{margins}}}\nvariants:\n  - name: a\n    endpoint: http://127.0.0.1:1\n"


@pytest.mark.parametrize("margins", ["e2e_mena: +5%", "e2e_mean: 5"])
def test_matrix_validate_refuses_a_margin_run_refuses(runner, write, margins):
    assert runner.invoke(cli, ["matrix", "validate", str(write("m.yaml", TWO.format(margins=margins)))]).exit_code == 2


def test_matrix_validate_names_the_misspelled_margin(runner, write):
    r = runner.invoke(cli, ["matrix", "validate", str(write("m.yaml", TWO.format(margins="e2e_mena: +5%")))])
    assert "matrix margins: unknown metric 'e2e_mena'" in r.output


@pytest.fixture
def forgets_replylen():
    import sys

    from evalkit.grading import registry

    path = list(sys.path)
    yield
    for d in (registry._LOCAL, registry._ROOTS, registry._ORIGIN):
        d.pop("replylen", None)
    sys.modules.pop("replylen", None)
    sys.path[:] = path
    registry.available.cache_clear()


def test_matrix_validate_knows_a_workload_grader_s_margin(runner, write, forgets_replylen):
    import shutil

    folder = write("m.yaml", "").parent / "support"
    shutil.copytree(PROJECT_DIR / "examples" / "support", folder)
    (folder / "matrix.yaml").write_text((folder / "matrix.yaml").read_text().replace(
        "margins: {", "margins: {reply_words: 20, "))  # replylen's own margin
    r = runner.invoke(cli, ["matrix", "validate", str(folder)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("name", "file"), [(None, "default.yaml"), ("default", "default.yaml"),
                                            ("capacity", "capacity.yaml")])
def test_matrix_show_prints_a_bundled_matrix_as_shipped(runner, name, file):
    from evalkit.paths import default_matrix_path

    r = runner.invoke(cli, ["matrix", "show", *([name] if name else [])])
    assert r.output == (default_matrix_path().parent / file).read_text(encoding="utf-8")


def test_matrix_show_prints_a_file(runner, write):
    text = TWO.format(margins="")
    assert runner.invoke(cli, ["matrix", "show", str(write("m.yaml", text))]).output == text


def test_matrix_show_refuses_an_unknown_name(runner):
    r = runner.invoke(cli, ["matrix", "show", "nope"])
    assert r.exit_code == 2
