"""Token-level divergence between two teacher-forced scorings of the same text (docs/measuring.md,
"Token-level divergence"): the baseline's distribution P and a candidate's Q at every answer token.

**KL direction**: D_KL(P ‖ Q) = Σ P log(P / Q), the baseline's distribution as the truth (what
llama.cpp's `--kl-divergence` reports). **The top-k approximation**: a server returns only the
top-k log-probabilities (and the forced token's). Each token known on both sides is its own
bucket; every other token is merged into one tail bucket, whose probability is one minus the
known ones on each side. Merging outcomes never raises a KL (the log-sum inequality), so the
figure is a lower bound of the full-vocabulary KL, and exactly

    KL_full − KL_buckets = P(tail) · D_KL(P(· | tail) ‖ Q(· | tail)),

the divergence inside the tail weighted by the baseline's tail mass: small when the baseline's
top-k holds nearly all of its mass, which each row records (`tail_mean`, `tail_max`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..stats import mean, percentile

APPROXIMATION = "top-k buckets (tokens known on both sides) + one tail bucket: a lower bound of the full KL"
EPS = 1e-12


@dataclass
class Comparison:
    """Per answer token of one pair of scorings."""

    kl: list[float]
    top1_agree: list[bool]
    dlp: list[float]  # the forced token's log-probability, candidate minus baseline
    tail: list[float]  # the baseline's probability outside the buckets
    buckets: list[int]

    @property
    def n(self) -> int:
        return len(self.kl)

    @property
    def first_top1_diff(self) -> int | None:
        return next((i for i, a in enumerate(self.top1_agree) if not a), None)

    def summary(self) -> dict[str, Any]:
        d = mean(self.dlp) or 0.0
        return {"n_tokens": self.n, "kl_mean": mean(self.kl), "kl_p90": percentile(self.kl, 90),
                "kl_p99": percentile(self.kl, 99), "kl_max": max(self.kl) if self.kl else None,
                "top1_pct": 100.0 * sum(self.top1_agree) / self.n if self.n else None,
                "dlogl_mean": d, "ppl_ratio": math.exp(-d), "first_top1_diff": self.first_top1_diff,
                "tail_mean": mean(self.tail), "tail_max": max(self.tail) if self.tail else None,
                "buckets_mean": mean([float(b) for b in self.buckets])}


def mismatch(p: dict[str, list[Any]], q: dict[str, list[Any]]) -> str | None:
    """Why two scorings of one answer cannot be compared token by token, or None: the two servers
    cut the text into different tokens (another tokenizer), so position i is not the same token."""
    if p["ids"] == q["ids"] and p.get("text") == q.get("text"):
        return None
    n, m = len(p["ids"]), len(q["ids"])
    i = next((k for k in range(min(n, m)) if p["ids"][k] != q["ids"][k] or
              (p.get("text") or [None] * n)[k] != (q.get("text") or [None] * m)[k]), min(n, m))

    def at(t: dict[str, list[Any]], k: int) -> str:
        return repr((t.get("text") or [None] * len(t["ids"]))[k]) + f" (id {t['ids'][k]})" if k < len(t["ids"]) else "end"

    return (f"the tokenizers differ: the answer is {m} tokens here and {n} on the baseline; first difference at token "
            f"{i}: {at(q, i)} vs {at(p, i)}")


def _known(tok: dict[str, list[Any]], i: int) -> dict[int, float]:
    out = dict(zip(tok["top_ids"][i], tok["top_lp"][i], strict=True))
    out.setdefault(tok["ids"][i], tok["lp"][i])
    return out


def position_kl(p: dict[int, float], q: dict[int, float]) -> tuple[float, float, int]:
    """(KL over the buckets, the baseline's tail mass, buckets) from each side's known
    log-probabilities at one position."""
    both = [t for t in p if t in q]
    ps = [math.exp(p[t]) for t in both]
    qs = [math.exp(q[t]) for t in both]
    kl = sum(a * (p[t] - q[t]) for a, t in zip(ps, both, strict=True))
    p_rest, q_rest = max(0.0, 1.0 - sum(ps)), max(EPS, 1.0 - sum(qs))
    if p_rest > EPS:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(0.0, kl), p_rest, len(both) + 1


def compare(p: dict[str, list[Any]], q: dict[str, list[Any]]) -> Comparison:
    """P = the baseline's scoring, Q = the other one, of the same tokens (check `mismatch` first)."""
    c = Comparison([], [], [], [], [])
    for i in range(len(p["ids"])):
        kp, kq = _known(p, i), _known(q, i)
        kl, tail, nb = position_kl(kp, kq)
        c.kl.append(kl)
        c.tail.append(tail)
        c.buckets.append(nb)
        c.top1_agree.append(p["top_ids"][i][0] == q["top_ids"][i][0])
        c.dlp.append(q["lp"][i] - p["lp"][i])
    return c


def first_diff_token(text: str, other: str, tokens: dict[str, list[Any]] | None) -> int | None:
    """Where two answers first differ, as a token index of ``text``'s scoring (by the decoded
    tokens' lengths); None when they are identical, the character index when there are no tokens."""
    if text == other:
        return None
    c = next((k for k, (a, b) in enumerate(zip(text, other, strict=False)) if a != b), min(len(text), len(other)))
    if not tokens or not tokens.get("text"):
        return c
    end = 0
    for k, piece in enumerate(tokens["text"]):
        end += len(piece or "")
        if end > c:
            return k
    return len(tokens["text"])
