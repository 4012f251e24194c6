"""`--search rate|concurrency`: the load of a capacity-frontier search (`probing.Search`), its SLOs
and its time bound, parsed at the edge. A search's SLOs are percentile goals over each probe (p99),
absolute (`ttft_p99=2s`, `e2e=8000`) or relative to the variant's own unloaded latency (`ttft=3x`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .load import Load, RunPolicy
from .probe_size import DEFAULT_SEARCH_TIME_S
from .probing import Search
from .sizing import parse_duration
from .stops import ErrorRate, OverSaturated, Slo, SloBreached, parse_slo

ALIASES = {"itl": "tpot"}  # a request's mean inter-token gap is its TPOT (one per request is kept)


def parse_search_slo(text: str | None, flag: str = "--slo") -> Slo:
    """`ttft_p99=2s,itl_p99=80ms,e2e=3x` -> an Slo whose limits the search holds at p99 of each
    probe. Units: ms (the default), s; a factor `x` is relative to the unloaded reference."""
    parts = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, val = part.strip().partition("=")
        key, val = key.strip(), val.strip().lower()
        metric, _, pct = key.partition("_p")
        if pct and pct not in ("99",):
            raise UsageError(f"{flag}: '{part}': a search holds p99 (e.g. ttft_p99=2s); p{pct} is not searched")
        metric = ALIASES.get(metric, metric)
        if val.endswith("ms"):
            val = val[:-2]
        elif val.endswith("s"):
            try:
                val = f"{float(val[:-1]) * 1000:g}"
            except ValueError:
                raise UsageError(f"{flag}: '{part}': expected a duration like 2s or 800ms, or a factor like 3x") from None
        parts.append(f"{metric}={val}" if eq else part)
    return parse_slo(",".join(parts), flag)


def search_load(axis: str, slo: str | None, *, base: Load | None = None, max_probes: int = 8,
                tolerance: float = 0.1, arrival: str | None = None, arrival_seed: int = 0,
                start: float | None = None, max_error_rate: float = 0.5, time_s: float = DEFAULT_SEARCH_TIME_S,
                variants: int = 1) -> Load:
    """The load of a frontier search: the `Search` pattern, its SLOs, over-saturation and the error
    rate as its probes' rules; the run policy of ``base`` (the options' load) kept. ``time_s``: the
    whole search's time, ``variants`` sharing it equally."""
    if axis not in ("rate", "concurrency"):
        raise UsageError(f"--search must be rate or concurrency, not {axis!r}")
    if max_probes < 3:
        raise UsageError("--max-probes: a search needs at least 3 probes (a reference, a pass and a failure)")
    if not 0 < tolerance < 1:
        raise UsageError("--search tolerance must be a fraction in (0, 1)")
    if arrival is not None and arrival not in ("poisson", "constant"):
        raise UsageError(f"--arrival must be poisson or constant, not {arrival!r}")
    if axis == "concurrency" and arrival is not None:
        raise UsageError("--arrival shapes a rate search's open-loop arrivals; a concurrency search is closed-loop")
    policy = base.policy if base is not None else RunPolicy()
    limits = parse_search_slo(slo)
    stops = (ErrorRate(max_error_rate), OverSaturated()) + ((SloBreached(limits),) if limits else ())
    pattern = Search(axis, max_probes, tolerance, arrival or "constant", arrival_seed, start,  # type: ignore[arg-type]
                     time_s, variants)
    pattern.plan(limits).check()
    return Load(pattern, stops, limits, policy)


CONFLICTS = {"sweep": "--sweep", "rate": "--rate", "concurrency": "--concurrency", "mode": "--mode",
             "max_concurrency": "--max-concurrency", "time_budget": "--time-budget", "resume_id": "--resume",
             "ray_address": "--ray"}


@dataclass
class SearchRequest:
    """`--search` and the options it takes over from `evalkit run` (its SLOs, its arrivals)."""

    axis: str
    slo: str | None
    arrival: str | None
    max_probes: int
    time_s: float = DEFAULT_SEARCH_TIME_S

    @classmethod
    def take(cls, options: dict[str, Any]) -> SearchRequest | None:
        """Pop the search's options from the command's (the rest build the run as usual); refuse,
        in one line, the options that give the run another shape."""
        axis, probes = options.pop("search", None), options.pop("max_probes", None) or 8
        given_time = options.pop("search_time", None)
        if axis is None:
            if given_time is not None:
                raise UsageError("--search-time bounds a --search: give --search rate or --search concurrency")
            return None
        given = [flag for key, flag in CONFLICTS.items() if options.get(key)]
        if given:
            raise UsageError(f"--search chooses its own load levels: drop {', '.join(given)}")
        time_s = parse_duration(given_time, "--search-time") if given_time is not None else DEFAULT_SEARCH_TIME_S
        return cls(axis, options.pop("slo", None), options.pop("arrival", None), probes, time_s)

    def load(self, base: Load, matrix_slo: str | None, arrival_seed: int = 0, variants: int = 1) -> Load:
        """The search's load; its SLOs from --slo, else the matrix's `load.slo`; its time shared by
        the matrix's ``variants``."""
        rule = base.rule(ErrorRate)
        return search_load(self.axis, self.slo if self.slo is not None else matrix_slo, base=base,
                           max_probes=self.max_probes, arrival=self.arrival, arrival_seed=arrival_seed,
                           max_error_rate=rule.max_rate if isinstance(rule, ErrorRate) else 0.5,
                           time_s=self.time_s, variants=variants)
