"""Formality: predict the level 1-5 of a text from lexical and syntactic markers (offline,
deterministic), and compare it with the level the prompt demanded."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..catalogue import CaseValue, Metric, detail_sql, pct_sql
from ..errors import RubricError
from ..paths import rubric_file, rubrics_dir
from ..spec.config import load_yaml_model as _load
from ..stats import mean
from .base import Aggregate, GradedRequest, Grader, GraderContext, Margin, Score, Threshold
from .resume import FormalityAttributes, formality_of
from .text import prose, sentences, terms, words

FEATURES = (
    "contraction_rate", "exclamation_rate", "question_rate", "emoji_count", "lowercase_start",
    "mean_sentence_words", "latinate_rate", "informal_terms", "formal_terms",
    "informal_opening", "formal_opening", "informal_closing", "formal_closing",
)

# Structural rules, fixed a priori (rubrics/formality.md): no word list in them. Every lexical
# marker (words, word pairs, openings, closings) comes from the tune file (formality_lexicon.json).
CONTRACTION = re.compile(r"\b[A-Za-z]+['’](?:t|m|re|ve|ll|d)\b", re.I)
EMOJI = re.compile(r"[\U0001F300-\U0001FAFF\u2600-\u27BF]|(?<!\w)[:;]-?[)D(P](?!\w)")
LATINATE = re.compile(r"\w{3,}(?:tion|sion|ment|ity|ance|ence|ive|ous|ate|ure|ory)s?$", re.I)


class FormalityRubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    intercept: float = 0.0
    weights: dict[str, float]
    thresholds: list[float] = Field(min_length=4, max_length=4)
    lexicon: str = Field("formality_lexicon.json", description="markers derived from the tune file")
    classifier: str | None = Field("formality_classifier.json", description="the second estimator")
    tune_file: str | None = None
    tune_sha256: str | None = None

    @field_validator("weights")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(unknown)} (known: {', '.join(FEATURES)})")
        return v

    @field_validator("thresholds")
    @classmethod
    def _ascending(cls, v: list[float]) -> list[float]:
        if v != sorted(v):
            raise ValueError("thresholds must be in ascending order")
        return v


def load_yaml_model(path: Path, model: type[BaseModel]) -> Any:
    """A rubric file into its pydantic model (errors name file:line and field)."""
    return _load(path, model, RubricError, "rubric")


@lru_cache(maxsize=8)
def _rubric(path: str) -> FormalityRubric:
    return load_yaml_model(Path(path), FormalityRubric)


def load_formality_rubric(path: Path | None = None) -> FormalityRubric:
    return _rubric(str(path or rubrics_dir() / "formality.yaml"))


@lru_cache(maxsize=8)
def _json(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RubricError(f"{path}: not found (rubrics/fit_formality.py writes it from the tune file)") from None
    except ValueError as e:
        raise RubricError(f"{path}: not valid JSON ({e})") from None


def load_lexicon(rubric: FormalityRubric | None = None) -> dict[str, dict[str, float]]:
    r = rubric or load_formality_rubric()
    return _json(str(rubrics_dir() / r.lexicon))


def features(text: str, lexicon: dict[str, dict[str, float]] | None = None) -> tuple[dict[str, float], list[str]]:
    """Feature values and the human-readable markers behind them."""
    lex = lexicon if lexicon is not None else load_lexicon()
    t = text.strip()
    sents = sentences(t) or [t]
    n_s = max(1, len(sents))
    ws = words(t)
    markers: list[str] = []
    f: dict[str, float] = dict.fromkeys(FEATURES, 0.0)
    contractions = CONTRACTION.findall(t)
    f["contraction_rate"] = len(contractions) / n_s
    f["exclamation_rate"] = t.count("!") / n_s
    f["question_rate"] = t.count("?") / n_s
    f["emoji_count"] = min(3, len(EMOJI.findall(t)))
    starts = [s[0] for s in sents if s and s[0].isalpha()]
    f["lowercase_start"] = 1.0 if starts and sum(c.islower() for c in starts) / len(starts) > 0.5 else 0.0
    f["mean_sentence_words"] = len(ws) / n_s
    f["latinate_rate"] = sum(1 for w in ws if LATINATE.match(w)) / max(1, len(ws))
    found = terms(t)
    low = {m: lvl for m in found["body"] if (lvl := lex.get("body", {}).get(m)) is not None}
    f["informal_terms"] = sum(3 - v for v in low.values() if v < 3) / n_s
    f["formal_terms"] = sum(v - 3 for v in low.values() if v > 3) / n_s
    for pos, key in (("opening", "opening"), ("closing", "closing")):
        hits = {m: lvl for m in found[pos] if (lvl := lex.get(pos, {}).get(m)) is not None}
        f[f"informal_{key}"] = max((3 - v for v in hits.values() if v < 3), default=0.0)
        f[f"formal_{key}"] = max((v - 3 for v in hits.values() if v > 3), default=0.0)
        if hits:
            m = max(hits, key=lambda k: abs(hits[k] - 3))
            markers.append(f"{key}: {m.strip('^$')!r} (tune level {hits[m]:.1f})")
    informal = sorted((m for m, v in low.items() if v < 3), key=lambda m: low[m])[:4]
    formal = sorted((m for m, v in low.items() if v > 3), key=lambda m: -low[m])[:4]
    if contractions:
        markers.append(f"contractions: {', '.join(sorted({c.lower() for c in contractions})[:5])}")
    if informal:
        markers.append(f"informal markers: {', '.join(informal)}")
    if formal:
        markers.append(f"formal markers: {', '.join(formal)}")
    if f["exclamation_rate"]:
        markers.append(f"{t.count('!')} exclamation mark(s)")
    if f["emoji_count"]:
        markers.append("emoji/emoticons")
    if f["lowercase_start"]:
        markers.append("sentences start in lower case")
    markers.append(f"{f['mean_sentence_words']:.0f} words/sentence, {f['latinate_rate']:.0%} Latinate")
    return f, markers


def raw_score(f: dict[str, float], r: FormalityRubric) -> float:
    return r.intercept + sum(r.weights.get(k, 0.0) * v for k, v in f.items())


def level_of(raw: float, r: FormalityRubric) -> int:
    return max(1, min(5, 1 + sum(1 for th in r.thresholds if raw >= th)))


def predict(text: str, rubric: FormalityRubric | None = None) -> tuple[int, float, dict[str, float], list[str]]:
    r = rubric or load_formality_rubric()
    f, markers = features(text, load_lexicon(r))
    raw = raw_score(f, r)
    return level_of(raw, r), raw, f, markers


def load_classifier(rubric: FormalityRubric | None = None) -> dict[str, Any] | None:
    r = rubric or load_formality_rubric()
    if not r.classifier or not (rubrics_dir() / r.classifier).exists():
        return None
    return _json(str(rubrics_dir() / r.classifier))


def classify(vecs: Any, feats: list[dict[str, float]], clf: dict[str, Any]) -> list[tuple[int, list[float]]]:
    """The second estimator: (level, class probabilities) per text, from its embedding and features."""
    import numpy as np

    f = np.array([[d[n] for n in clf["feature_names"]] for d in feats], dtype=float)
    x = np.hstack([np.asarray(vecs), (f - np.array(clf["feature_mean"])) / np.array(clf["feature_std"])])
    logits = x @ np.array(clf["coef"]).T + np.array(clf["intercept"])
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return [(int(clf["classes"][int(i)]), [round(float(v), 4) for v in row]) for i, row in zip(p.argmax(axis=1), p,
                                                                                                  strict=True)]


class FormalityAggregate(Aggregate):
    view_columns = (("formality_predicted", "value"),)
    columns = (Metric("formality_mae", "formality MAE", 2, "mean |predicted - requested| level"),
                       Metric("formality_within1_pct", "formality ±1 %", 0, "share within one level"),
                       Metric("formality_embed_mae", "formality MAE (emb.)", 2,
                                     "the same with the embedding estimator"),
                       Metric("formality_agree_pct", "estimators agree %", 0,
                                     "share where both estimators give the same level"),
                       Metric("formality_disagree_n", "disagree ≥2", 0,
                                     "outputs whose two estimates differ by two levels or more"))
    thresholds = (Threshold("formality_mae", "formality_mae", "max", "maximum mean |predicted - requested| level"),)
    margins = (Margin("formality_mae", "abs", False, "|predicted - requested| level, candidate minus baseline"),)
    scatter = ("formality", "requested level", "predicted level")

    @classmethod
    def margin_values(cls, grades: list[dict[str, Any]], baseline_side: bool) -> dict[str, dict[str, float]]:
        acc: dict[str, list[float]] = {}
        for g in grades:
            if "error" in g["detail"]:
                acc.setdefault(g["case_id"], []).append(abs(g["detail"]["error"]))
        return {"formality_mae": {k: sum(v) / len(v) for k, v in acc.items()}}

    notes_where = ("estimators_disagree",)

    @classmethod
    def case_values(cls, baseline_side: bool) -> dict[str, CaseValue]:
        return {"formality_mae": CaseValue("detail.error", absolute=True)}

    @classmethod
    def notes(cls, rows: list[dict[str, Any]]) -> list[str]:
        out = []
        for r in rows:
            d = r["grades"].get("formality", {}).get("detail", {})
            if d.get("estimators_disagree"):
                out.append(f"formality estimators disagree by ≥2 on request {r['id']} ({r['variant']}, {r['case_id']}): "
                           f"markers {d['predicted']}, embeddings {d['embed_level']}, requested {d['requested']}")
        return out

    @classmethod
    def summarise(cls, grades: list[dict[str, Any]], base_grades: list[dict[str, Any]] | None) -> dict[str, Any]:
        errs = [abs(g["detail"]["error"]) for g in grades if "error" in g["detail"]]
        emb = [g["detail"] for g in grades if g["detail"].get("embed_level") is not None]
        return {"formality_mae": mean(errs),
                "formality_within1_pct": 100.0 * sum(e <= 1 for e in errs) / len(errs) if errs else None,
                "formality_n": len(errs),
                "formality_embed_mae": mean([abs(d["embed_level"] - d["requested"]) for d in emb]),
                "formality_agree_pct": 100.0 * sum(d["embed_level"] == d["predicted"] for d in emb) / len(emb)
                if emb else None,
                "formality_disagree_n": sum(abs(d["embed_level"] - d["predicted"]) >= 2 for d in emb) if emb else None}

    @classmethod
    def summary_sql(cls) -> dict[str, str]:
        err, emb = f"abs({detail_sql('error')})", detail_sql("embed_level")
        gap, off = f"abs({emb} - {detail_sql('predicted')})", f"abs({emb} - {detail_sql('requested')})"
        return {"formality_mae": f"avg({err})", "formality_within1_pct": pct_sql(f"{err} <= 1", err),
                "formality_n": f"count({err})", "formality_embed_mae": f"avg({off})",
                "formality_agree_pct": pct_sql(f"{emb} = {detail_sql('predicted')}", emb),
                "formality_disagree_n": f"case when count({emb}) > 0 then count(*) filter (where {gap} >= 2) end"}


class FormalityGrader(Grader):
    name = "formality"
    version = "2"  # 2: markers derived from the tune file only; a second, embedding-based estimator
    description = ("formality level 1-5 by two estimators fitted on the tune file (markers; embeddings), "
                   "vs the requested level")
    requires = ("formality",)
    attributes_model = FormalityAttributes
    aggregate = FormalityAggregate
    calibration_file = "formality_test.jsonl"


    @classmethod
    def calibrate(cls, path: Any = None) -> dict[str, Any]:
        return calibrate(path)

    @classmethod
    def calibration_lines(cls, r: dict[str, Any]) -> list[str]:
        out = [r["file"]]
        for est in ("markers", "embeddings"):
            if est not in r:
                continue
            x = r[est]
            out.append(f"  {est}: n={x['n']}  exact={x['exact_accuracy']:.1%}  within ±1={x['within_1_accuracy']:.1%}  "
                       f"MAE={x['mae']:.2f}  Spearman rho={x['spearman_rho']:.3f}  recall by level "
                       + " ".join("-" if v is None else f"{v:.0%}" for v in x["recall_by_level"]))
            out.append("    confusion (rows: labelled 1-5, columns: predicted 1-5): "
                       + " | ".join(" ".join(f"{v:2d}" for v in row) for row in x["confusion"]))
        if "agreement" in r:
            out.append(f"  the two estimators agree on {r['agreement']:.1%}; {r['disagree_by_2']} disagree by 2 or more")
        return out

    @classmethod
    def validate_rubrics(cls, rubrics: Path) -> str:
        f = load_yaml_model(rubric_file(rubrics, "formality.yaml"), FormalityRubric)
        return f"formality features: {len(f.weights)}"

    def __init__(self, rubric: FormalityRubric | None = None, embed: Any = None) -> None:
        self.rubric = rubric or load_formality_rubric()
        self.embed = embed
        self.classifier = load_classifier(self.rubric) if embed is not None else None

    @classmethod
    def from_context(cls, ctx: GraderContext) -> FormalityGrader:
        return cls(load_formality_rubric(ctx.rubric("formality.yaml")), embed=ctx.embed)


    def grade_batch(self, items: list[GradedRequest]) -> list[Score]:
        texts = [prose(i.text) for i in items]
        preds = [predict(t, self.rubric) for t in texts]
        second: list[tuple[int, list[float]] | None] = [None] * len(items)
        if self.classifier is not None and items:
            second = list(classify(self.embed(texts), [p[2] for p in preds], self.classifier))
        return [self._score(i, p, s) for i, p, s in zip(items, preds, second, strict=True)]

    def grade(self, item: GradedRequest) -> Score:
        return self.grade_batch([item])[0]

    def _score(self, item: GradedRequest, pred: tuple, second: tuple[int, list[float]] | None) -> Score:
        level, raw, f, markers = pred
        want = formality_of(item.case)
        err = level - want
        detail: dict[str, Any] = {"predicted": level, "requested": want, "error": err, "raw_score": round(raw, 4),
                                  "features": {k: round(v, 4) for k, v in f.items()}, "markers": markers,
                                  "embed_level": None}
        expl = f"predicted {level} vs requested {want} ({err:+d})"
        if second is not None:
            detail.update({"embed_level": second[0], "embed_probs": second[1],
                           "estimators_disagree": abs(second[0] - level) >= 2})
            expl += f"; embedding estimator {second[0]}" + (" (disagree by ≥2)" if abs(second[0] - level) >= 2 else "")
        return Score(value=float(level), passed=abs(err) <= 1, explanation=expl + "; " + "; ".join(markers[:4]),
                     detail=detail)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho with average ranks for ties."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else None


def read_labelled_file(p: Path) -> list[tuple[str, int]]:
    from ..errors import UsageError
    from ..spec.config import jsonl_objects

    rows = []
    for i, row in jsonl_objects(p, "calibration file"):
        try:
            text, level = row["text"], row["level"]
        except (KeyError, TypeError):
            raise UsageError(f"{p}:{i}: expected a JSON object with 'text' and 'level'") from None
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 5:
            raise UsageError(f"{p}:{i}: field 'level': must be an integer 1-5")
        rows.append((text, level))
    if not rows:
        raise UsageError(f"{p}: no labelled rows")
    return rows


def figures(gold: list[int], preds: list[int]) -> dict[str, Any]:
    n = len(gold)
    confusion = [[0] * 5 for _ in range(5)]
    for g, pr in zip(gold, preds, strict=True):
        confusion[g - 1][pr - 1] += 1
    return {
        "n": n,
        "exact_accuracy": sum(g == pr for g, pr in zip(gold, preds, strict=True)) / n,
        "within_1_accuracy": sum(abs(g - pr) <= 1 for g, pr in zip(gold, preds, strict=True)) / n,
        "mae": sum(abs(g - pr) for g, pr in zip(gold, preds, strict=True)) / n,
        "spearman_rho": spearman([float(x) for x in gold], [float(x) for x in preds]),
        "recall_by_level": [round(confusion[i][i] / sum(confusion[i]), 4) if sum(confusion[i]) else None
                            for i in range(5)],
        "confusion": confusion,
    }


def calibrate(path: Path | None = None, rubric: FormalityRubric | None = None, embed: Any = None) -> dict[str, Any]:
    """Both estimators on a labelled JSONL of {"text", "level"} (default: the held-out test file):
    exact, within ±1, MAE, Spearman rho, recall per level, confusion, and their agreement."""
    r = rubric or load_formality_rubric()
    p = path or rubrics_dir() / "formality_test.jsonl"
    rows = read_labelled_file(p)
    texts = [prose(t) for t, _ in rows]
    gold = [lvl for _, lvl in rows]
    preds = [predict(t, r) for t in texts]
    out: dict[str, Any] = {"file": str(p), "markers": figures(gold, [x[0] for x in preds])}
    clf = load_classifier(r)
    if clf is not None:
        if embed is None:
            from .embeddings import embed as default_embed

            embed = default_embed
        second = [lv for lv, _ in classify(embed(texts), [x[2] for x in preds], clf)]
        out["embeddings"] = figures(gold, second)
        out["agreement"] = sum(a[0] == b for a, b in zip(preds, second, strict=True)) / len(rows)
        out["disagree_by_2"] = sum(abs(a[0] - b) >= 2 for a, b in zip(preds, second, strict=True))
    return out
