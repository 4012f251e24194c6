"""Each rubric rule with hand-written passing and failing outputs; formality calibration; drift
with its noise floor; bootstrap and verdict on constructed data where the answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.errors import RubricError
from evalkit.grading import GradedRequest
from evalkit.grading.drift import DriftGrader, field_diff, rouge_l
from evalkit.grading.formality import FormalityGrader, calibrate, load_yaml_model, predict
from evalkit.grading.persona import PersonaGrader, PersonaRubric, load_persona_rubric
from evalkit.spec.dataset import load_cases
from evalkit.stats import bootstrap_ci, verdict
from evalkit.testing.stub_server import StubConfig, StubServer


def case(task: str = "cold_outreach", persona: str = "eng_manager_fintech", candidate: str = "maya_chen",
         complexity: str = "long"):
    return next(c for c in load_cases() if (c.attributes["task"], c.attributes["persona"], c.attributes["candidate"],
                                            c.complexity) == (task, persona, candidate, complexity))


def email(body: str, subject: str = "Payments role at Ledgerly", sign_off: str = "Best regards, Maya") -> str:
    return json.dumps({"subject": subject, "body": body, "sign_off": sign_off})


GOOD = ("Dear Priya, I am Maya Chen, a backend engineer who built Kafka settlement pipelines at Brightwave "
        "Payments. The Senior Backend Engineer role on the Payments Platform at Ledgerly fits my Python, Go "
        "and PostgreSQL work. Would you have 20 minutes next week?")


def rules(text: str, c=None) -> dict:
    s = PersonaGrader().grade(GradedRequest(1, "v", text, "stop", c or case()))
    return s.detail["rules"]


def test_a_good_outreach_email_passes_every_rule():
    s = PersonaGrader().grade(GradedRequest(1, "v", email(GOOD), "stop", case()))
    assert s.passed, s.explanation
    assert s.value == 1.0, s.explanation
    assert set(s.detail["rules"]) == {"mentions_company", "mentions_role", "mentions_skills", "no_invented_facts",
                                      "outreach_length", "one_call_to_action"}


@pytest.mark.parametrize("rule, bad_body", [
    ("mentions_company", GOOD.replace("at Ledgerly", "at your company")),
    ("mentions_role", GOOD.replace("The Senior Backend Engineer role on the Payments Platform", "Your opening")
     .replace("a backend engineer", "an engineer")),
    ("mentions_skills", GOOD.replace("Kafka ", "").replace("my Python, Go and PostgreSQL work", "my background")),
    ("no_invented_facts", GOOD + " I also led 45 engineers at Google from 2012."),
    ("no_invented_facts", GOOD.replace("a backend engineer", "a backend engineer with a PhD")),
    ("outreach_length", GOOD + " More detail." * 160),
    ("one_call_to_action", GOOD.replace("Would you have 20 minutes next week?", "Thanks.")),
    ("one_call_to_action", GOOD + " Could we also meet on Friday? Let me know."),
])
def test_each_rule_fails_on_a_hand_written_bad_output(rule: str, bad_body: str):
    r = rules(email(bad_body, subject="Hello"))
    assert r[rule]["passed"] is False, r[rule]
    assert rules(email(GOOD, subject="Hello"))[rule]["passed"] is True  # the same rule passes the good text


def test_invented_facts_are_named():
    r = rules(email(GOOD + " I also led 45 engineers at Google from 2012."))
    why = r["no_invented_facts"]["why"]
    assert "year 2012" in why
    assert "number 45" in why
    assert "Google" in why
    # facts that ARE in the prompt do not count as invented
    ok = rules(email(GOOD + " I cut p99 latency from 850 ms to 210 ms and hold a BSc Computer Science."))
    assert ok["no_invented_facts"]["passed"], ok["no_invented_facts"]


def test_salutation_and_sign_off_apply_only_to_formal_personas():
    formal = case(persona="hiring_committee", candidate="daniel_okafor")
    good = email("Dear Members of the Hiring Committee, I am Daniel Okafor, a data engineer. I apply for the "
                 "Senior Data Engineer role at the National Statistics Office. Would you consider my SQL work?",
                 sign_off="Yours faithfully, Daniel Okafor")
    r = rules(good, formal)
    assert r["salutation"]["passed"]
    assert r["sign_off"]["passed"]
    bad = email("Hey team! Daniel here, data engineer, keen on the Senior Data Engineer role at the National "
                "Statistics Office. SQL is my thing. Chat?", sign_off="Cheers")
    r = rules(bad, formal)
    assert not r["salutation"]["passed"]
    assert not r["sign_off"]["passed"]
    assert "salutation" not in rules(email(GOOD))  # the fintech manager gets no formal-letter rules


def test_profile_rewrite_gets_no_outreach_rules():
    c = case(task="profile_rewrite")
    out = json.dumps({"headline": "Backend engineer for Ledgerly's Senior Backend Engineer, Payments Platform role",
                      "summary": "Seven years of Python, Go and PostgreSQL on payment systems.",
                      "skills": ["Python", "Go"]})
    r = rules(out, c)
    assert "one_call_to_action" not in r
    assert "outreach_length" not in r
    assert r["mentions_company"]["passed"]
    assert r["mentions_skills"]["passed"]


def test_persona_similarity_is_a_soft_signal():
    from evalkit.grading.embeddings import embed

    g = PersonaGrader(embed=embed)
    items = [GradedRequest(1, "v", email(GOOD), "stop", case())]
    s = g.grade_batch(items)[0]
    assert 0 < s.detail["persona_similarity"] <= 1
    assert "persona similarity" in s.explanation
    assert s.value == 1.0  # not part of the score


@pytest.mark.parametrize("yaml_text, expected", [
    ("version: 1\nrules:\n  mentions_ceo: {weight: 1}\n", "unknown rule(s) mentions_ceo"),
    ("version: 1\nrules:\n  salutation:\n    pattern: '(unclosed'\n", ":4: field 'rules.salutation.pattern'"),
    ("version: 1\nrules:\n  mentions_company:\n    weight: heavy\n", ":4: field 'rules.mentions_company.weight'"),
    ("version: 1\nrules:\n  mentions_company: {colour: red}\n", "unknown key"),
    ("rules: [1, 2\n", "not valid YAML"),
])
def test_bad_persona_rubric_names_file_line_and_field(tmp_path: Path, yaml_text: str, expected: str):
    p = tmp_path / "persona.yaml"
    p.write_text(yaml_text)
    with pytest.raises(RubricError) as e:
        load_yaml_model(p, PersonaRubric)
    assert str(e.value).startswith(str(p)), str(e.value)
    assert expected in str(e.value), str(e.value)


def test_formality_grade_has_level_error_and_markers():
    c = case()  # requested level from the dataset
    casual = email("hey priya!! gonna keep it short lol, i'm super into ledgerly's payments stuff. wanna chat? 🙂",
                   sign_off="cheers")
    s = FormalityGrader().grade(GradedRequest(1, "v", casual, "stop", c))
    assert s.detail["predicted"] == 1
    assert s.detail["requested"] == c.attributes["formality"]
    assert s.detail["error"] == 1 - c.attributes["formality"]
    assert any("contractions" in m for m in s.detail["markers"])
    assert any("informal markers" in m for m in s.detail["markers"])
    formal = ("Dear Members of the Hiring Committee, I respectfully submit my application for the position. "
              "I would be most grateful for the opportunity to present my qualifications. Yours faithfully, D.")
    assert predict(formal)[0] == 5


def test_formality_with_both_estimators_flags_disagreement():
    from evalkit.grading.embeddings import embed

    g = FormalityGrader(embed=embed)
    s = g.grade(GradedRequest(1, "v", email(GOOD), "stop", case()))
    assert s.detail["embed_level"] in range(1, 6)
    assert len(s.detail["embed_probs"]) == 5
    assert s.detail["estimators_disagree"] == (abs(s.detail["embed_level"] - s.detail["predicted"]) >= 2)
    summary = FormalityGrader.aggregate.summarise([{"value": 3.0, "passed": True, "case_id": "a", "detail": {
        "predicted": 3, "requested": 3, "error": 0, "embed_level": 5}}], None)
    assert summary["formality_disagree_n"] == 1
    assert summary["formality_agree_pct"] == 0.0


# Held-out figures on rubrics/formality_test.jsonl (130 texts never used for fitting); pinned, so a
# change that lowers them fails here. docs/graders.md, "Formality calibration".
TEST_FLOOR = {"markers": (0.73, 0.99), "embeddings": (0.85, 0.99)}


@pytest.mark.integration
def test_formality_test_file_figures_are_pinned(runner):
    r = calibrate()
    assert r["file"].endswith("formality_test.jsonl")
    for est, (exact, within1) in TEST_FLOOR.items():
        assert r[est]["n"] == 130
        assert r[est]["exact_accuracy"] >= exact, (est, r[est])
        assert r[est]["within_1_accuracy"] >= within1, (est, r[est])
    out = runner.invoke(cli, ["graders", "calibrate"])
    assert out.exit_code == 0
    assert "markers: n=130" in out.output
    assert "embeddings: n=130" in out.output
    assert "agree on" in out.output
    js = json.loads(runner.invoke(cli, ["graders", "calibrate", "--json"]).output)
    assert len(js["embeddings"]["confusion"]) == 5
    assert len(js["markers"]["recall_by_level"]) == 5


@pytest.mark.integration
def test_formality_fit_uses_the_tune_file_only():
    """The split is disjoint and complete; every lexical marker is derived from the tune file (no
    marker occurs only in the test file); refitting from the tune file reproduces the rubric."""
    import subprocess
    import sys

    from evalkit.grading.formality_fit import derive_lexicon, read_labelled
    from evalkit.grading.text import terms
    from evalkit.paths import rubrics_dir

    d = rubrics_dir()
    tune, test = read_labelled(d / "formality_tune.jsonl"), read_labelled(d / "formality_test.jsonl")
    everything = read_labelled(d / "formality_labelled.jsonl")
    assert len(everything) >= 300
    assert len(tune) + len(test) == len(everything)
    assert not {r["text"] for r in tune} & {r["text"] for r in test}
    assert {r.get("genre") for r in everything} >= {"email", "headline", "summary", "note"}
    assert any(r["source"].startswith("model:") for r in test)
    assert any(r["source"].startswith("model:") for r in tune)
    lexicon = json.loads((d / "formality_lexicon.json").read_text())
    assert {k: v for k, v in lexicon.items() if k != "tune_sha256"} == derive_lexicon(tune)
    in_tune = {pos: set().union(*(terms(r["text"])[pos] for r in tune)) for pos in ("body", "opening", "closing")}
    only_test = [(pos, m) for pos in in_tune for m in lexicon[pos] if m not in in_tune[pos]]
    assert not only_test
    r = subprocess.run([sys.executable, str(d / "fit_formality.py"), "check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout, r.stdout + r.stderr


@pytest.mark.integration
def test_calibrate_bad_file_is_a_usage_error(runner, write):
    p = write("lab.jsonl", '{"text": "hi", "level": 3}\n{"text": "x", "level": 9}\n')
    r = runner.invoke(cli, ["graders", "calibrate", "--file", str(p)])
    assert r.exit_code == 2
    assert f"{p}:2: field 'level'" in r.output


@pytest.mark.integration
def test_rubrics_validate(runner, tmp_path: Path):
    r = runner.invoke(cli, ["rubrics", "validate"])
    assert r.exit_code == 0
    assert "outreach_email" in r.output
    assert "mentions_company" in r.output
    d = tmp_path / "rub"
    (d / "schemas").mkdir(parents=True)
    (d / "persona.yaml").write_text("version: 1\nrules:\n  nope: {}\n")
    (d / "formality.yaml").write_text((Path(load_persona_rubric.__code__.co_filename).parents[2] / "rubrics"
                                       / "formality.yaml").read_text())
    r = runner.invoke(cli, ["rubrics", "validate", "--dir", str(d)])
    assert r.exit_code == 2
    assert "unknown rule(s) nope" in r.output
    (d / "persona.yaml").write_text("version: 1\nrules: {}\n")
    (d / "schemas" / "x.schema.json").write_text('{"type": "objekt"}')
    r = runner.invoke(cli, ["rubrics", "validate", "--dir", str(d)])
    assert r.exit_code == 2
    assert "invalid JSON Schema" in r.output


def test_rouge_and_field_diff_known_answers():
    assert rouge_l("a b c d", "a b c d") == 1.0
    assert rouge_l("a b c d", "e f g h") == 0.0
    assert rouge_l("the cat sat", "the cat sat down") == pytest.approx(2 * 1 * 0.75 / 1.75)
    d = field_diff('{"a": "x y", "b": "z"}', '{"a": "x y", "c": "z"}')
    assert d["same_keys"] is False
    assert d["fields"]["a"]["equal"]
    assert not d["fields"]["b"]["equal"]
    assert field_diff("not json", "{}") is None


def test_drift_grader_pairs_reference_floor_and_candidate():
    import numpy as np

    c = case()
    vec = {"same": np.array([1.0, 0.0]), "close": np.array([0.8, 0.6]), "far": np.array([0.0, 1.0])}
    g = DriftGrader(lambda texts: [vec[t] for t in texts])
    items = [GradedRequest(1, "bf16", "same", "stop", c), GradedRequest(2, "bf16", "close", "stop", c),
             GradedRequest(3, "w8a8", "far", "stop", c)]
    out = g.grade_outputs(items, {1: 0, 2: 1, 3: 0}, "bf16")
    # the reference is the baseline under the other seed (repeat 1); both pairs differ by one seed
    assert out[2].detail["kind"] == "reference"
    assert out[1].detail["kind"] == "noise_floor"
    assert out[1].value == pytest.approx(0.8)
    assert out[3].detail["kind"] == "drift"
    assert out[3].value == pytest.approx(0.6)
    assert out[3].detail["against_request_id"] == 2 == out[1].detail["against_request_id"]
    # with one baseline pass, the reference is repeat 0 and there is no floor
    solo = g.grade_outputs([items[0], items[2]], {1: 0, 3: 0}, "bf16")
    assert solo[1].detail["kind"] == "reference"
    assert solo[3].detail["drift"] == pytest.approx(1.0)
    assert solo[3].detail["same_seed"]  # one baseline pass: no other seed to compare with, and it says so


def test_bootstrap_ci_and_verdict_on_known_data():
    shifted = [0.2 + 0.01 * ((i % 5) - 2) for i in range(40)]  # mean 0.2, tiny spread
    ci = bootstrap_ci(shifted)
    assert ci[0] > 0.18
    assert ci[1] < 0.22
    assert verdict(ci, "above", "below") == "above"
    centred = [(-1) ** i * 0.1 for i in range(40)]  # mean 0
    ci0 = bootstrap_ci(centred)
    assert ci0[0] < 0 < ci0[1]
    assert verdict(ci0, "above", "below") == "within noise"
    assert verdict(bootstrap_ci([-0.3] * 10 + [-0.31] * 10), "above", "below") == "below"
    assert bootstrap_ci(shifted) == ci  # seeded: reproducible
    assert bootstrap_ci([1.0]) is None


def test_full_grading_on_a_stub_run_with_noise_floor(runner, stub_pair, endpoint_matrix, ledger_path):
    a, b = stub_pair
    m = endpoint_matrix(a.base_url, b.base_url, baseline_repeats=2)
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "6", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    measured = list(db["requests"].rows_where("is_warmup = 0"))
    assert len(measured) == 6 * 2 + 6
    for grader in ("schema", "persona", "formality", "drift"):
        got = {g["request_id"] for g in db["grades"].rows_where("grader = ?", [grader])}
        assert got == {x["id"] for x in measured}, grader
    kinds = [json.loads(g["detail_json"])["kind"] for g in db["grades"].rows_where("grader = 'drift'")]
    assert kinds.count("reference") == 6
    assert kinds.count("noise_floor") == 6
    assert kinds.count("drift") == 6
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json"]).output)
    cand = next(x for x in rep["rows"] if x["variant"] == "cand" and x["complexity"] == "all")
    # the stubs answer identically: no drift, no floor, and the verdict says there is no floor to measure
    # against (what temperature 0 gives) instead of "could detect ≥ 0.000"
    assert cand["drift_mean"] == pytest.approx(0, abs=1e-5)
    assert cand["floor_mean"] == pytest.approx(0, abs=1e-5)
    assert cand["drift_verdict"].startswith("no noise floor")
    assert cand["drift_pairs"] == 6
    assert "could detect" not in cand["drift_verdict"]  # "could detect ≥ 0.000" said nothing true
    assert cand["formality_mae"] is not None
    assert cand["persona_score"] is not None
    # re-grading adds nothing; a new grader version would add rows without touching old ones
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger_path)])
    assert "0 new grades" in r.output
    before = db["grades"].count
    db.execute("update grades set grader_version = '0' where grader = 'formality'")
    r = runner.invoke(cli, ["grade", "--ledger", str(ledger_path), "--grader", "formality"])
    assert "18 new grades" in r.output
    assert db["grades"].count == before + 18


def test_llm_judge_grades_with_parsed_score_and_raw_answer(runner, stub, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(fixed_text="Score: 4\nClear and specific.", ttft_ms=1, itl_ms=0)) as judge:
        extra = f"judge:\n  endpoint: {judge.base_url}\n  model: judge-model\n"
        m = endpoint_matrix(stub.base_url, extra=extra)
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "2", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    g = list(db["grades"].rows_where("grader = 'judge'"))
    assert len(g) == 2
    assert all(x["value"] == 4.0 and x["passed"] == 1 for x in g)
    crit = json.loads(g[0]["detail_json"])["criteria"]
    assert set(crit) == {"persona_fit", "faithfulness"}
    assert crit["faithfulness"]["raw"].startswith("Score: 4")


def test_unseen_persona_and_candidate_are_graded_from_the_requested_formality(runner, stub, tmp_path, write):
    """A user's own dataset: a persona and a candidate the rubric has never seen. Salutation and
    sign-off apply when formality 4-5 is asked for, and not at 1-3."""
    base = case(persona="hiring_committee", candidate="daniel_okafor")
    rows = []
    for level in (2, 5):
        row = json.loads(base.model_dump_json(by_alias=True))
        row.update({"id": f"procurement-{level}", "persona": "procurement_lead", "persona_title": "Procurement lead",
                    "persona_description": "Buys software for a hospital group; careful, formal, cost-minded.",
                    "candidate": "sam_rivera", "formality": level})
        rows.append(json.dumps(row))
    data = write("mine.jsonl", "\n".join(rows) + "\n")
    formal = email("Dear Procurement Lead, I write regarding the data engineer role.", sign_off="Kind regards, Sam")
    c5 = load_cases(data)[1]
    assert c5.attributes["persona"] == "procurement_lead"
    assert c5.attributes["formality"] == 5
    r = rules(formal, c5)
    assert r["salutation"]["passed"]
    assert r["sign_off"]["passed"]
    casual = email("Hey! Sam here, keen on the data role.", sign_off="Cheers")
    r = rules(casual, c5)
    assert not r["salutation"]["passed"]
    assert not r["sign_off"]["passed"]
    assert "salutation" not in rules(casual, load_cases(data)[0])  # formality 2: no formal-letter rules

    m = write("m.yaml", f"name: mine\nbaseline: a\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\nvariants:\n  - name: a\n"
                        f"    endpoint: {stub.base_url}\n")
    ledger = tmp_path / "mine.db"
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--dataset", str(data), "--ledger", str(ledger), "-q"])
    assert r.exit_code == 0, r.output
    grades = {g["request_id"]: json.loads(g["detail_json"]) for g in
              Database(ledger)["grades"].rows_where("grader = 'persona' and grader_version = '2'")}
    applied = [("salutation" in d["rules"]) for _, d in sorted(grades.items())]
    assert applied == [False, True]


@pytest.mark.integration
def test_persona_rules_measured_against_labelled_outputs(runner):
    """rubrics/persona_labels.jsonl: 63 real SmolLM2 outputs and 20 targeted written cases, labelled
    per rule. The figures are pinned so a change that lowers them fails; docs/graders.md, "Persona rules"."""
    from evalkit.grading.persona import calibrate_persona

    r = calibrate_persona()
    assert r["n"] >= 60
    rules = r["rules"]
    assert set(rules) >= {"mentions_company", "mentions_role", "mentions_skills", "no_invented_facts",
                          "one_call_to_action", "salutation", "sign_off"}
    assert rules["no_invented_facts"]["fail_precision"] >= 0.78
    assert rules["no_invented_facts"]["fail_recall"] >= 0.81
    assert rules["one_call_to_action"]["accuracy"] >= 0.89
    assert all(x["accuracy"] >= 0.88 for x in rules.values())
    out = runner.invoke(cli, ["graders", "calibrate", "--grader", "persona"])
    assert out.exit_code == 0
    assert "no_invented_facts: n=" in out.output
    assert "precision" in out.output


@pytest.mark.integration
def test_onnx_embeddings_match_torch_on_the_calibration_texts():
    """The fast path (the shipped MiniLM weights exported to ONNX Runtime) keeps every cosine
    within 0.001 of the torch reference on the labelled texts."""
    from evalkit.grading import embeddings as emb
    from evalkit.paths import rubrics_dir

    texts = [json.loads(x)["text"] for x in (rubrics_dir() / "formality_labelled.jsonl").read_text().splitlines()]
    assert emb.backend() == "onnx"
    fast, ref = emb.encode_batch(texts), emb.encode_torch(texts)
    assert fast.shape == ref.shape == (len(texts), 384)
    assert float((fast * ref).sum(axis=1).min()) >= 0.999


@pytest.fixture
def two_repeat_drift():
    """--repeats 2 with baseline_repeats 2: the baseline sends repeats 0, 1 and a floor pass 2."""
    import numpy as np

    c = case()
    texts = {1: "b0", 2: "b1", 3: "b2", 4: "w0", 5: "w1"}
    vec = {t: np.array([1.0, float(i)]) / np.hypot(1.0, float(i)) for i, t in enumerate(texts.values())}
    g = DriftGrader(lambda ts: [vec[t] for t in ts])
    items = [GradedRequest(k, "bf16" if t[0] == "b" else "w8a8", t, "stop", c) for k, t in texts.items()]
    return g.grade_outputs(items, {1: 0, 2: 1, 3: 2, 4: 0, 5: 1}, "bf16")


def test_with_two_repeats_the_reference_is_the_floor_pass(two_repeat_drift):
    assert two_repeat_drift[3].detail["kind"] == "reference"


@pytest.mark.parametrize("request_id", [4, 5])
def test_each_candidate_repeat_is_compared_with_the_floor_pass_never_with_its_own_seed(two_repeat_drift, request_id):
    assert two_repeat_drift[request_id].detail["against_request_id"] == 3


@pytest.mark.parametrize("request_id", [1, 2])
def test_each_measured_baseline_repeat_is_a_noise_floor_pair(two_repeat_drift, request_id):
    assert two_repeat_drift[request_id].detail["kind"] == "noise_floor"


@pytest.fixture
def two_repeats_no_floor_pass():
    """--repeats 2 with baseline_repeats 1: the baseline sends repeats 0 and 1 only, the reference
    is its repeat 0."""
    import numpy as np

    c = case()
    texts = {1: "b0", 2: "b1", 4: "w0", 5: "w1"}
    vec = {t: np.array([1.0, float(i)]) / np.hypot(1.0, float(i)) for i, t in enumerate(texts.values())}
    g = DriftGrader(lambda ts: [vec[t] for t in ts])
    items = [GradedRequest(k, "bf16" if t[0] == "b" else "w8a8", t, "stop", c) for k, t in texts.items()]
    return g.grade_outputs(items, {1: 0, 2: 1, 4: 0, 5: 1}, "bf16")


@pytest.mark.parametrize(("request_id", "against"), [(2, 1), (4, 2), (5, 1)])
def test_without_a_floor_pass_every_pair_is_a_seed_apart(two_repeats_no_floor_pass, request_id, against):
    """The candidate's repeat 0 shares the reference's seed: it is compared with the baseline's
    repeat 1 instead, like the floor pair (repeat 1 against repeat 0)."""
    assert two_repeats_no_floor_pass[request_id].detail["against_request_id"] == against


@pytest.mark.parametrize("request_id", [2, 4, 5])
def test_without_a_floor_pass_no_pair_shares_a_seed(two_repeats_no_floor_pass, request_id):
    assert "same_seed" not in two_repeats_no_floor_pass[request_id].detail


def test_load_drift_says_how_often_answers_changed_not_a_restated_p_value():
    from evalkit.grading.load_drift import LoadDriftGrader

    grades = [{"passed": k >= 5, "detail": {"drift": 0.0 if k >= 5 else 0.1, "level": 4}} for k in range(20)]
    v = LoadDriftGrader.aggregate.summarise(grades, None)["load_drift_verdict"]
    assert v.startswith("5 of 20 answers changed under load (changed share 95 % interval [11, 47] %)")
