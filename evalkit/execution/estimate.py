"""How long the measured part of a run will take, estimated from the warm-ups before it starts.

The warm-ups have two prompt lengths (short and long), so prefill is fitted as a line in prompt
tokens, and decode from their time per output token. Every case is assumed to generate
`max_tokens` (small models tend to run to the limit), so this is an upper estimate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..spec.matrix import Matrix
from ..stats import mean
from .load import Load, WorkItem
from .scoring import scoring_ms


@dataclass
class RunEstimate:
    n_requests: int
    measure_s: float  # this variant (or interleaved group)'s measured requests
    rest_s: float  # the variants still to come, assumed as fast, plus their server starts
    basis: str

    @property
    def total_s(self) -> float:
        return self.measure_s + self.rest_s

    def line(self, name: str) -> str:
        rest = f"; the whole run about {_mmss(self.total_s)} more" if self.rest_s else ""
        return (f"estimate: '{name}' {self.n_requests} requests take about {_mmss(self.measure_s)}{rest} "
                f"({self.basis})")


def _mmss(s: float) -> str:
    return f"{int(s // 60)} min {int(s % 60):02d} s"


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x; with one distinct x, a line through the origin."""
    if len(set(xs)) < 2:
        x, y = mean(xs) or 1.0, mean(ys) or 0.0
        return 0.0, y / x if x else 0.0
    mx, my = mean(xs) or 0.0, mean(ys) or 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    if my - b * mx < 0:  # a negative fixed cost is noise (prefill grows faster than linearly): through the origin
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return my - b * mx, b


def _chars(item: WorkItem) -> int:
    return sum(len(m.content) for m in item.case.messages)


def estimate_variant(warm_rows: list[dict[str, Any]], warm: list[WorkItem], main: Iterable[WorkItem], matrix: Matrix,
                     load: Load, remaining_variants: int = 0, server_start_s: float = 0.0) -> RunEstimate | None:
    ok = [r for r in warm_rows if r["error_class"] is None and r["ttft_ms"] is not None and r["prompt_tokens"]]
    if not ok:
        return None
    # the timing probes come after the grammars are compiled; the first warm-ups pay for that
    ok = [r for r in ok if "-probe-" in r["case_id"]] or ok
    chars = {it.case.id: _chars(it) for it in warm}
    # tokens per character of this model's tokenizer (chat template included), from the warm-ups
    tok_per_char = mean([r["prompt_tokens"] / chars[r["case_id"]] for r in ok if chars.get(r["case_id"])]) or 0.25
    a, b = _fit([float(r["prompt_tokens"]) for r in ok], [r["ttft_ms"] for r in ok])
    tpot = mean([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None])
    if tpot is None:
        return None
    decode_ms = (matrix.generation.max_tokens - 1) * tpot
    total_ms = longest = 0.0
    n = 0
    for it in main:  # one pass: a large run's items are generated, not listed
        ms = max(0.0, a + b * _chars(it) * tok_per_char) + decode_ms
        total_ms, longest, n = total_ms + ms, max(longest, ms), n + 1
    if not n:
        return None
    sequential_ms = total_ms
    levels = load.levels()
    if levels[0].open_loop and levels[0].rate:
        rate = levels[0].rate
        total_ms = max(n / rate * 1000.0, longest)
        basis = f"open loop at {rate:g}/s"
    elif load.pattern.adaptive:  # a search: each level is chosen from the last, within its time
        share = getattr(load.pattern, "share_s", None)
        if share:
            total_ms = share * 1000.0
        basis = (f"a search: each level is chosen from the last, at most {getattr(load.pattern, 'max_probes', '?')}, "
                 "within its share of --search-time")
    elif load.concurrent:
        total_ms = sum(total_ms / lv.concurrency for lv in levels)  # as if batching scaled perfectly
        basis = (f"{len(levels)} concurrency level(s): a lower bound, assuming batching scales perfectly; "
                 f"sequential it would be {_mmss(sequential_ms / 1000 * len(levels))}")
    else:
        basis = (f"prefill {a:.0f} ms + {b:.2f} ms/prompt token, decode {tpot:.1f} ms/token x "
                 f"{matrix.generation.max_tokens - 1}")
    # teacher-forced scoring after the load (execution/scoring.py): prefill only, no generation
    score_ms = scoring_ms(matrix, main, lambda it, extra: max(0.0, a + b * (_chars(it) * tok_per_char + extra)),
                          decode_ms)
    if score_ms:
        total_ms += score_ms
        basis += f"; teacher-forced scoring about {score_ms / n / 1000:.1f} s per case"  # a budget keeps a share
    measure_s = total_ms / 1000.0
    rest_s = remaining_variants * (measure_s + server_start_s)
    return RunEstimate(n, measure_s, rest_s, basis)
