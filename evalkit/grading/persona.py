"""Persona adherence: rubric rules (context keys, channel rules, no invented facts) plus an
embedding similarity to the persona description as a soft signal."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..catalogue import PASS_PCT_SQL, Metric
from ..paths import rubric_file, rubrics_dir
from ..spec.dataset import Case
from ..stats import mean
from .base import Aggregate, CannedQuery, GradedRequest, Grader, GraderContext, Margin, Score, Threshold, pass_pct
from .formality import load_yaml_model
from .resume import ResumeAttributes, resume
from .text import json_fields, prose, sentences, words

STOP = {"a", "an", "the", "of", "and", "for", "at", "in", "on", "to", "ii", "i", "senior", "staff"}
NUMBER_WORDS = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
                "eight": "8", "nine": "9", "ten": "10", "twelve": "12", "twenty": "20", "hundred": "100"}
YEAR = re.compile(r"\b(?:19|20)\d{2}\b")
NUMBER = re.compile(r"\b\d[\d,.]*\b")
DEGREE = re.compile(r"\b(?:B\.?Sc|M\.?Sc|Ph\.?D|MBA|B\.?A\.|M\.?A\.|B\.?Eng|M\.?Eng|bachelor'?s?|master'?s?|doctorate)\b", re.I)
# a capitalised name after at/with/for/joined/from; words joined by single spaces only, so a
# sentence end or a line break ends the name
EMPLOYER = re.compile(r"\b(?:at|with|for|joined|from) ((?:[A-Z][A-Za-z0-9&'-]*)(?: [A-Z][A-Za-z0-9&'-]*){0,3})")


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, ge=0)
    required: bool = False
    tasks: list[str] | None = None
    personas: list[str] | None = None
    # also applies to any persona (named or not) when the requested formality is at least this
    min_formality: int | None = Field(None, ge=1, le=5)
    min_overlap: float | None = Field(None, ge=0, le=1)
    min: int | None = Field(None, ge=0)
    max_words: int | None = Field(None, ge=1)
    patterns: list[str] | None = None
    pattern: str | None = None

    @field_validator("patterns")
    @classmethod
    def _compile_all(cls, v: list[str] | None) -> list[str] | None:
        for p in v or []:
            _check_regex(p)
        return v

    @field_validator("pattern")
    @classmethod
    def _compile(cls, v: str | None) -> str | None:
        if v is not None:
            _check_regex(v)
        return v

    def applies(self, case: Case) -> bool:
        """Task filter first; then the named personas, or (for personas the rubric has never seen,
        e.g. in a user's own dataset) a requested formality at or above `min_formality`."""
        a = resume(case)
        if self.tasks is not None and a.task not in self.tasks:
            return False
        if self.personas is None and self.min_formality is None:
            return True
        return (self.personas is not None and a.persona in self.personas) or (
            self.min_formality is not None and a.formality >= self.min_formality)


def _check_regex(p: str) -> None:
    try:
        re.compile(p)
    except re.error as e:
        raise ValueError(f"bad regex {p!r}: {e}") from None


RULES = ("mentions_company", "mentions_role", "mentions_skills", "no_invented_facts", "outreach_length",
         "one_call_to_action", "salutation", "sign_off")


class PersonaRubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    rules: dict[str, Rule]
    similarity: bool = True

    @field_validator("rules")
    @classmethod
    def _known(cls, v: dict[str, Rule]) -> dict[str, Rule]:
        unknown = sorted(set(v) - set(RULES))
        if unknown:
            raise ValueError(f"unknown rule(s) {', '.join(unknown)} (known: {', '.join(RULES)})")
        return v


@lru_cache(maxsize=8)
def _rubric(path: str) -> PersonaRubric:
    return load_yaml_model(Path(path), PersonaRubric)


def load_persona_rubric(path: Path | None = None) -> PersonaRubric:
    return _rubric(str(path or rubrics_dir() / "persona.yaml"))


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.lower())


def source_text(case: Case) -> str:
    """Everything the model was given: facts in the output must come from here."""
    return "\n".join(m.content for m in case.messages)


def invented_facts(output: str, source: str, case: Case) -> list[str]:
    src = _norm(source)
    src_numbers = set(NUMBER.findall(source)) | {d for w, d in NUMBER_WORDS.items() if re.search(rf"\b{w}\b", src)}
    found: list[str] = []
    for y in YEAR.findall(output):
        if y not in src:
            found.append(f"year {y}")
    for n in NUMBER.findall(output):
        n = n.rstrip(".,")
        if n and not YEAR.fullmatch(n) and n not in src_numbers and n.replace(",", "") not in src_numbers:
            found.append(f"number {n}")
    for d in DEGREE.findall(output):
        if _norm(d) not in src:
            found.append(f"degree {d}")
    allowed = _norm(resume(case).context_keys.company)
    for m in EMPLOYER.finditer(output):
        name = m.group(1)
        first = _norm(name.split(" ")[0])
        # known when the name, or its first word ("Brightwave" of "Brightwave Payments Inc"), is in the prompt
        if len(first) > 2 and _norm(name) not in src and not re.search(rf"\b{re.escape(first)}\b", src + " " + allowed):
            found.append(f"organisation {name!r}")
    return sorted(set(found))


def check(rule_name: str, rule: Rule, case: Case, text: str, raw: str) -> tuple[bool, str]:
    low = _norm(text)
    ck = resume(case).context_keys
    if rule_name == "mentions_company":
        ok = _norm(ck.company) in low
        return ok, f"{'mentions' if ok else 'does not mention'} {ck.company}"
    if rule_name == "mentions_role":
        content = [w.lower() for w in words(ck.role) if w.lower() not in STOP]
        hit = [w for w in content if re.search(rf"\b{re.escape(w)}\b", low)]
        share = len(hit) / len(content) if content else 1.0
        need = rule.min_overlap if rule.min_overlap is not None else 0.5
        return share >= need, f"role words {len(hit)}/{len(content)} ({', '.join(hit) or 'none'})"
    if rule_name == "mentions_skills":
        hit = [s for s in ck.skills if _norm(s) in low]
        need = rule.min if rule.min is not None else 1
        return len(hit) >= need, f"matching skills named: {', '.join(hit) or 'none'} (need {need})"
    if rule_name == "no_invented_facts":
        bad = invented_facts(text, source_text(case), case)
        return not bad, ("invented: " + ", ".join(bad[:5])) if bad else "no facts outside the prompt"
    if rule_name == "outreach_length":
        fields = json_fields(raw)
        body = fields.get("body", text) if fields else text
        n = len(words(body))
        limit = rule.max_words or 160
        return n <= limit, f"body {n} words (max {limit})"
    if rule_name == "one_call_to_action":
        pats = [re.compile(p, re.I) for p in (rule.patterns or [])]
        ctas = [s for s in sentences(text) if any(p.search(s) for p in pats)]
        return len(ctas) == 1, f"{len(ctas)} call(s) to action"
    if rule_name in ("salutation", "sign_off"):
        pat = re.compile(rule.pattern or "", re.I | re.M)
        ok = bool(pat.search(text))
        return ok, f"{rule_name.replace('_', ' ')} {'present' if ok else 'missing'}"
    raise AssertionError(rule_name)


class PersonaAggregate(Aggregate):
    view_columns = (("persona_score", "value"),)
    columns = (Metric("persona_score", "persona score", 2, "weighted share of rubric rules met"),
                       Metric("persona_pass_pct", "persona pass %", 0, "share passing every required rule"))
    thresholds = (Threshold("persona_pass", "persona_pass_pct", "min", "minimum share passing every required persona "
                            "rule, 0-1", scale=100.0),
                  Threshold("persona_score", "persona_score", "min", "minimum mean persona score, 0-1"))
    margins = (Margin("persona_pass", "pp", True, "persona pass rate, candidate minus baseline, percentage points"),)
    canned_queries = (CannedQuery("persona_failures", "Outputs that failed a required persona rule", "failures"),)

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"persona_score": mean([g["value"] for g in grades]), "persona_pass_pct": pass_pct(grades)}

    @classmethod
    def summary_sql(cls) -> dict[str, str]:
        return {"persona_score": "avg(value)", "persona_pass_pct": PASS_PCT_SQL}


class PersonaGrader(Grader):
    name = "persona"
    version = "2"  # 2: salutation and sign-off also apply from the requested formality (min_formality)
    description = "persona rubric (rubrics/persona.yaml): weighted rules, required ones decide pass"
    requires = ("task", "persona", "candidate", "formality", "context_keys")
    attributes_model = ResumeAttributes
    aggregate = PersonaAggregate
    calibration_file = "persona_labels.jsonl"

    @classmethod
    def calibrate(cls, path: Any = None) -> dict[str, Any]:
        return calibrate_persona(path)

    @classmethod
    def calibration_lines(cls, r: dict[str, Any]) -> list[str]:
        out = [f"{r['file']}: {r['n']} labelled outputs"]
        for rule, x in r["rules"].items():
            p_, rc = x["fail_precision"], x["fail_recall"]
            out.append(f"  {rule}: n={x['n']} accuracy={x['accuracy']:.1%} failures: labelled {x['labelled_fail']}, "
                       f"flagged {x['flagged_fail']}, precision {'-' if p_ is None else f'{p_:.1%}'}, "
                       f"recall {'-' if rc is None else f'{rc:.1%}'}")
        return out

    @classmethod
    def validate_rubrics(cls, rubrics: Path) -> str:
        p = load_yaml_model(rubric_file(rubrics, "persona.yaml"), PersonaRubric)
        return f"persona rules: {', '.join(p.rules)}"

    def __init__(self, rubric: PersonaRubric | None = None, embed: Any = None) -> None:
        self.rubric = rubric or load_persona_rubric()
        self.embed = embed  # callable list[str] -> vectors; None: no similarity signal

    @classmethod
    def from_context(cls, ctx: GraderContext) -> PersonaGrader:
        return cls(load_persona_rubric(ctx.rubric("persona.yaml")), embed=ctx.embed)


    def grade(self, item: GradedRequest, similarity: float | None = None) -> Score:
        text = prose(item.text)
        results: dict[str, dict[str, Any]] = {}
        total = got = 0.0
        for name, rule in self.rubric.rules.items():
            if not rule.applies(item.case):
                continue
            ok, why = check(name, rule, item.case, text, item.text)
            results[name] = {"passed": ok, "why": why, "weight": rule.weight, "required": rule.required}
            total += rule.weight
            got += rule.weight if ok else 0.0
        score = got / total if total else 1.0
        failed = [n for n, r in results.items() if not r["passed"]]
        passed = all(r["passed"] for r in results.values() if r["required"])
        expl = f"{score:.2f}; " + ("all rules pass" if not failed else
                                   "failed: " + "; ".join(f"{n} ({results[n]['why']})" for n in failed))
        if similarity is not None:
            expl += f"; persona similarity {similarity:.2f}"
        return Score(score, passed, expl, {"rules": results, "persona_similarity": similarity})

    def grade_batch(self, items: list[GradedRequest]) -> list[Score]:
        sims: list[float | None] = [None] * len(items)
        if self.rubric.similarity and self.embed is not None and items:
            from .embeddings import cosine

            outs = self.embed([prose(i.text) for i in items])
            descs = self.embed([resume(i.case).persona_description or resume(i.case).persona for i in items])
            sims = [cosine(a, b) for a, b in zip(outs, descs, strict=True)]
        return [self.grade(i, s) for i, s in zip(items, sims, strict=True)]


def calibrate_persona(path: Path | None = None, rubric: PersonaRubric | None = None) -> dict[str, Any]:
    """Per rule, against labelled outputs ({"case_id", "text", "labels": {rule: passes?}}, cases from
    the shipped dataset): accuracy, and precision / recall of the rule's failures (a failure is what
    a reader acts on)."""
    from ..errors import UsageError
    from ..spec.dataset import load_cases

    p = path or rubrics_dir() / "persona_labels.jsonl"
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{p}: labelled file not found") from None
    cases = {c.id: c for c in load_cases()}
    grader = PersonaGrader(rubric)
    tallies: dict[str, dict[str, int]] = {}
    n = 0
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            case, text, labels = cases[row["case_id"]], row["text"], row["labels"]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{p}:{i}: expected case_id (a shipped case), text and labels") from None
        got = grader.grade(GradedRequest(i, "labelled", text, "stop", case)).detail["rules"]
        n += 1
        for rule, want in labels.items():
            if rule not in got:
                continue
            t = tallies.setdefault(rule, {"n": 0, "agree": 0, "tp": 0, "fp": 0, "fn": 0})
            flagged_fail, labelled_fail = not got[rule]["passed"], not want
            t["n"] += 1
            t["agree"] += flagged_fail == labelled_fail
            t["tp"] += flagged_fail and labelled_fail
            t["fp"] += flagged_fail and not labelled_fail
            t["fn"] += labelled_fail and not flagged_fail
    rules = {}
    for rule, t in tallies.items():
        flagged, labelled = t["tp"] + t["fp"], t["tp"] + t["fn"]
        rules[rule] = {"n": t["n"], "accuracy": t["agree"] / t["n"], "labelled_fail": labelled, "flagged_fail": flagged,
                       "fail_precision": t["tp"] / flagged if flagged else None,
                       "fail_recall": t["tp"] / labelled if labelled else None,
                       "false_failures": t["fp"], "missed_failures": t["fn"]}
    return {"file": str(p), "n": n, "rules": rules}
