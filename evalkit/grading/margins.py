"""Margins, the team's terms for a verdict, parsed once for every command: which metrics take one
(latency, every grader's declared margin, each pass/fail grader's flip rate), in which unit, how
many hypotheses each brings to a variant's Holm family, and the fewest pairs that can decide them
(`stats.pairs_for_a_verdict`). The run sizes itself and refuses a bad margin with this module
before anything is sent; `reporting.verdicts` tests the margins it returns (docs/verdicts.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..catalogue import named
from ..errors import UsageError
from ..stats import pairs_for_a_verdict
from .registry import available
from .registry import margins as grader_margins

ALPHA = 0.05
# latency margins: paired by case (repeats averaged), lower is better except throughput
# margin name -> (request column, higher is better): every metric the catalogue says can carry a margin
LATENCY = {f"{k}_mean": (m.key, m.higher) for k, m in named("margin").items()}
_VALUE = re.compile(r"^\s*([+-]?)\s*(\d+(?:\.\d+)?)\s*(pp|%|ms)?\s*$")
UNIT = {"pp": " pp", "abs": "", "%": " %", "ms": " ms"}
# absolute margins whose own unit is percentage points (of answer tokens): "pp" may be said
POINTS = {"top1_agreement"}
ALL_FLIPS = "flips_max"  # a margin on every flips metric at once (reporting/flips.py)


def flip_metrics() -> dict[str, str]:
    """flips metric -> grader: every registered grader with a pass-rate ("pp") margin."""
    return {f"{name}_flips": name for name, cls in available().items() if any(m.unit == "pp"
                                                                               for m in cls.aggregate.margins)}


def is_flips(metric: str) -> bool:
    return metric in flip_metrics()


def expand_flips(items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """`flips_max=5pp` -> one margin per flips metric (an explicit one for a grader wins)."""
    given = {str(k).strip() for k, _ in items}
    out = []
    for k, v in items:
        if str(k).strip() == ALL_FLIPS:
            out += [(m, v) for m in flip_metrics() if m not in given]
        else:
            out.append((k, v))
    return out


@dataclass
class MarginSpec:
    metric: str
    value: float  # in the metric's delta unit (pp, abs, % of the baseline mean, ms), signed: candidate − baseline
    unit: str  # "pp", "abs", "%", "ms"
    higher_is_better: bool
    text: str
    min_pairs: int = 0  # the grader's floor for this margin (its per-case shape): fewer pairs read inconclusive
    # only the margin is tested: 0 is the best a variant can read (a flip rate, a batching floor)
    one_sided: bool = False

    def describe(self) -> str:
        return f"{self.value:+g}{UNIT[self.unit]}"


def qualified(key: str) -> str | None:
    """`accuracy:gsm8k` -> `accuracy` when that grader margin takes a qualifier (`Margin.qualified`)."""
    base, sep, part = key.partition(":")
    m = grader_margins().get(base)
    return base if sep and part and m is not None and m[1].qualified else None


def known_metrics() -> dict[str, tuple[str, bool]]:
    """metric name -> (unit kind, higher is better), the graders' and the latency ones."""
    out = {k: ("latency", hib) for k, (_, hib) in LATENCY.items()}
    for name, (_, m) in grader_margins().items():
        out[name] = (m.unit, m.higher_is_better)
    out.update({name: ("pp", False) for name in [*flip_metrics(), ALL_FLIPS]})  # flip rates (reporting/flips.py)
    return out


def parse_margins(spec: dict[str, Any] | str | None, where: str = "--margins") -> list[MarginSpec]:
    """`drift=0.05,schema_pass=-2pp,formality_mae=+0.2,e2e_mean=+0%` (or the same as a mapping).
    An unsigned number is the worsening allowed (sign taken from which way is worse); a signed one
    is used as written (e.g. e2e_mean=-10% asks for 10 % faster). Latency takes % or ms and pass
    rates pp, always said: a bare number there is refused rather than guessed."""
    if not spec:
        return []
    items = spec.items() if isinstance(spec, dict) else [p.partition("=")[::2] for p in spec.split(",") if p.strip()]
    items = expand_flips(list(items))  # flips_max: one margin per pass/fail grader's flip rate
    known = known_metrics()
    out = []
    for key, raw in items:
        key = str(key).strip()
        if key not in known and (q := qualified(key)) is not None:  # accuracy:gsm8k: a part of a margin
            known[key] = known[q]
        if key not in known:
            raise UsageError(f"{where}: unknown metric '{key}' (known: {', '.join(sorted(known))})")
        kind, hib = known[key]
        m = _VALUE.match(str(raw))
        if not m:
            raise UsageError(f"{where}: '{key}={raw}': expected a number, optionally signed, with pp, % or ms")
        sign, num, unit = m.group(1), float(m.group(2)), m.group(3)
        if kind == "latency":
            if unit not in ("%", "ms"):
                raise UsageError(f"{where}: '{key}={raw}': a latency margin needs its unit: give % or ms "
                                 f"(e.g. {key}=+5% or {key}=+50ms)")
        elif kind == "pp":
            if unit != "pp":
                raise UsageError(f"{where}: '{key}={raw}': a pass-rate margin is in percentage points (pp)")
            unit = "pp"
        elif unit == "pp" and key in POINTS:
            unit = "abs"  # tested as a mean per case; said in points, as its threshold may be in %
        elif unit is not None:
            raise UsageError(f"{where}: '{key}={raw}': this metric takes a plain number")
        else:
            unit = "abs"
        value = -num if sign == "-" else num if sign == "+" else (-num if hib else num)
        declared = grader_margins().get(qualified(key) or key)
        out.append(MarginSpec(key, value, unit, hib, f"{key}={raw}", declared[1].min_pairs if declared else 0,
                              is_flips(key) or bool(declared and declared[1].one_sided)))
    return out


def matrix_margins(matrix: Any, resolved: bool = False) -> list[MarginSpec]:
    """A matrix's margins as `run` refuses them before anything is sent, and `matrix validate`
    checks them: its workload's graders known first (a `module:Class` from its folder declares
    margins too), then every margin parsed. ``resolved``: the caller has resolved the graders."""
    from .registry import resolve, use_workload

    if not resolved:
        use_workload(matrix.folder)
        resolve(list(matrix.graders or []))
    return parse_margins(matrix.margins, "matrix margins")


def pairs_needed(specs: list[MarginSpec], n_hypotheses: int | None = None, alpha: float = ALPHA) -> int:
    """The fewest pairs with which every one of these margins can reach a verdict
    (`stats.pairs_for_a_verdict`: Holm's first step, exact pass-rate and flip tests, the
    margins' own floors)."""
    kinds = tuple(("flips" if is_flips(ms.metric) else ms.unit, ms.value) for ms in specs)
    return pairs_for_a_verdict(hypotheses(specs) if n_hypotheses is None else n_hypotheses, alpha, kinds,
                               max((ms.min_pairs for ms in specs), default=0))


def hypotheses(specs: list[MarginSpec]) -> int:
    """How many hypotheses a variant's margins bring: the margin and 0 each (one when the margin is 0)."""
    return sum(len(tested_values(ms)) for ms in specs)


def tested_values(ms: MarginSpec) -> tuple[float, ...]:
    """The differences a margin's hypotheses put to the test: the margin and 0 (once when equal). A
    one-sided margin has no "better than the baseline" side (0 flips is the baseline itself; a
    batching floor is what an identical variant reads): the margin only."""
    return (ms.value,) if ms.one_sided else tuple(dict.fromkeys((ms.value, 0.0)))
