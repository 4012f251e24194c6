"""Every metric evalkit shows, declared once (after AIPerf's `metrics/`): its key, label, unit,
digits and one-line meaning, and for a report column how it is computed from the requests
(`source` column + `agg`). The terminal report, Markdown, HTML, Datasette's column descriptions,
the dataset card and the definitions table in docs/measuring.md all read these declarations
through `fmt` and `label`; graders declare theirs the same way (`Metric` is a grader's summary
column). Adding a metric is one declaration here (docs/architecture.md shows one).

May import: nothing from evalkit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    digits: int | None = 2  # None: shown as text
    meaning: str = ""
    unit: str = ""  # "ms", "%", "pp", "tokens", "tok/s", "" (a count or a share's own unit)
    source: str | None = None  # the request column a report metric summarises
    agg: str | None = None  # "mean", "max", "pNN", "count", "errors"; None: computed by name in the report
    ok_only: bool = True  # aggregate successful requests only
    signed: bool = False  # a difference: printed with its sign
    ci_key: str | None = None  # the key of its interval, printed beside it
    # A request metric's short name (`ttft`) and what it can carry (`USES`): a margin on its mean
    # (`ttft_mean`), a percentile target (`ttft_p99`), a per-request SLO (`ttft=2000`), a row of the
    # per-slice summaries; ``higher``: higher is better. Margins, targets, SLOs and summaries read
    # these (`named`), so a new measured field is one declaration.
    short: str | None = None
    uses: frozenset[str] = frozenset()
    higher: bool = False
    # a derived metric's SQL over the `measured` view's columns (`ledger.analysis` computes it there)
    sql: str | None = None

    @property
    def header(self) -> str:
        return self.label

    def describe(self) -> str:
        """The one line Datasette and the card show: meaning, then unit."""
        return self.meaning + (f" ({self.unit})" if self.unit and self.unit not in self.meaning else "")



_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class CaseValue:
    """A grader's per-case value of one margin, declared (issue 48) so the ledger computes it where
    the grades are instead of handing every grade to `Aggregate.margin_values`: ``source`` is
    "value", "passed" (1.0 or 0.0) or "detail.KEY" (a number in the grade's detail), its absolute
    value with ``absolute``, taken from the grades whose detail fields equal ``where``'s texts. A
    case's value is the mean over its grades with one, or with ``first`` its lowest repeat's (the
    first sent on a tie). ``by_suite``: that value also counts for the margin `NAME:SUITE` of the
    grade's suite (its detail's `suite`, else the case id's `suite/<name>/...`, else "?")."""

    source: str
    first: bool = False
    absolute: bool = False
    where: tuple[tuple[str, str], ...] = ()
    by_suite: bool = False

    def __post_init__(self) -> None:
        keys = [self.source.removeprefix("detail.")] if self.source.startswith("detail.") else []
        if self.source not in ("value", "passed") and not keys:
            raise ValueError(f"CaseValue source {self.source!r}: 'value', 'passed' or 'detail.KEY'")
        bad = [k for k in keys + [k for k, _ in self.where] if not _NAME.match(k)]
        if bad:
            raise ValueError(f"CaseValue detail key {bad[0]!r}: letters, digits and _ only")

def detail_sql(key: str) -> str:
    """A grade's detail key as a number in a `summary_sql` expression (NULL where it has none)."""
    if not _NAME.match(key):
        raise ValueError(f"detail key {key!r}: letters, digits and _ only")
    return f"try_cast(json_extract(detail_json, '$.{key}') as double)"


# `grading.base.pass_pct` as a `summary_sql` expression: 100 x the sum of `passed` over its non-NULL count
PASS_PCT_SQL = "case when count(passed) > 0 then 100.0::double * sum(passed) / count(passed) end"


def pct_sql(cond: str, of: str) -> str:
    """100 x the share of ``of``'s non-NULL values meeting ``cond``, NULL over none: a `summary_sql` share."""
    return f"case when count({of}) > 0 then 100.0::double * count({of}) filter (where {cond}) / count({of}) end"


def fmt(m: Metric | None, value: Any, digits: int | None = None) -> str:
    """The one number formatter: '-' for missing, thousands separators, the metric's digits, a sign
    for differences, [lo, hi] for an interval, text as it is."""
    if value is None:
        return "-"
    d = m.digits if m is not None and digits is None else digits
    signed = m is not None and m.signed
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return "[" + ", ".join(fmt(Metric("", "", d, signed=True), x) for x in value) + "]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or d is None:
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return f"{value:+,.{d}f}" if signed else f"{value:,.{d}f}"


def _ms(key: str, label: str, meaning: str, source: str, agg: str) -> Metric:
    return Metric(key, label, 0, meaning, "ms", source, agg)


USES = ("margin", "target", "slo", "summary")
_ALL = frozenset(USES)


# What one request row carries (Datasette's column descriptions, the dataset card's definitions).
REQUEST: tuple[Metric, ...] = (
    Metric("ttft_ms", "TTFT", 1, "send to the first generated token of any kind (answer or reasoning), kernel receive "
           "time", "ms", short="ttft", uses=_ALL),
    Metric("tpot_ms", "TPOT", 2, "(E2E - TTFT) / (output tokens - 1), reasoning and answer tokens alike", "ms",
           short="tpot", uses=_ALL),
    Metric("e2e_ms", "E2E", 1, "send to the receive time of the read that ended the stream", "ms", short="e2e",
           uses=_ALL),
    Metric("itl_mean_ms", "ITL mean", 2, "mean gap between token chunks, reasoning and answer alike (TTFT excluded)",
           "ms", short="itl", uses=frozenset({"margin", "target", "summary"})),
    Metric("ttfo_ms", "TTFO", 1, "send to the first answer token (time to first output): TTFT for a model that does "
           "not reason", "ms", short="ttfo", uses=frozenset({"margin"})),
    Metric("reasoning_ms", "reasoning time", 1, "TTFO - TTFT: the thinking streamed before the answer", "ms"),
    # think-length inflation: a quantized reasoning model that thinks longer can cancel its speed-up
    Metric("reasoning_tokens", "reasoning tokens", 0, "tokens of reasoning (usage details, else its streamed chunks)",
           "tokens", short="reasoning_tokens", uses=frozenset({"margin"})),
    Metric("first_chunk_ms", "first chunk", 1, "first SSE event of any kind (vLLM's role-only chunk)", "ms"),
    Metric("ttft_user_ms", "TTFT (user clock)", 1, "TTFT by the event loop's clock, beside the kernel's", "ms"),
    Metric("e2e_user_ms", "E2E (user clock)", 1, "E2E by the event loop's clock, beside the kernel's", "ms"),
    Metric("prompt_tokens", "prompt tokens", 0, "prompt tokens, from the stream's usage chunk", "tokens"),
    Metric("completion_tokens", "output tokens", 0, "output tokens, from the stream's usage chunk", "tokens"),
    Metric("cached_prompt_tokens", "cached prompt tokens", 0, "prompt tokens the server's prefix cache served",
           "tokens"),
    Metric("order_block", "order block", 0, "its group of the alternation: a case (one request at a time) or a "
           "chunk of cases (a loaded level, --order blocks), then one pair of the latency verdicts; "
           "docs/verdicts.md"),
    Metric("order_position", "order position", 0, "its place in that group: 0 was sent first"),
    Metric("srv_queue_ms", "server queue", 1, "server: time waiting in the scheduler queue", "ms"),
    Metric("srv_prefill_ms", "server prefill", 1, "server: scheduled to first token (prefill)", "ms"),
    Metric("srv_decode_ms", "server decode", 1, "server: first to last token", "ms"),
    Metric("srv_ttft_ms", "server TTFT", 1, "server: arrival to first token (queue + prefill)", "ms"),
    Metric("srv_resp_prefill_ms", "server prefill (own timing)", 1,
           "vLLM's per-request time_to_first_token_ms: scheduled to first token", "ms"),
    Metric("srv_resp_queue_ms", "server queue (own timing)", 1, "vLLM's per-request queue_time_ms", "ms"),
    Metric("srv_kv_cache_usage_peak", "KV peak", 3, "server: peak KV-cache use during the request, fraction 0-1"),
    Metric("srv_scrapes", "scrapes", 0, "server: /metrics samples taken during the request"),
    Metric("srv_preemptions", "preemptions", 0, "server: preemptions counted during the request"),
    Metric("srv_method", "server timing from", None, "response (vLLM's own per-request timing), histogram_delta "
                                                     "(sequential /metrics delta) or window (concurrent /metrics)"),
    Metric("client_lag_max_ms", "client lag", 1, "the client's worst event-loop lag during the request", "ms"),
    Metric("timing_suspect", "timing suspect", None, "1 = the client's own lag may have bent this row's timing"),
    Metric("timestamp_source", "clock", None, "kernel (SO_TIMESTAMPNS receive times) or user (the event loop's)"),
    Metric("is_warmup", "warm-up", None, "1 = warm-up request, excluded from all statistics"),
    Metric("final", "final", None, "1 = the last attempt for this case (0 = an attempt that was retried)"),
    Metric("error_class", "error", None, "why the request failed (NULL = it succeeded)"),
    Metric("text", "text", None, "the generated text, verbatim"),
)

# Computed from a request's columns when it is read, not stored (`reporting.rows`).
DERIVED: tuple[Metric, ...] = (
    Metric("out_tps", "output tok/s", 1, "output tokens over E2E in seconds: the request's throughput as its user sees it",
           "tok/s",
           short="out_tps", uses=frozenset({"margin", "summary"}), higher=True,
           sql="case when ok and completion_tokens <> 0 and e2e_ms <> 0 then completion_tokens / (e2e_ms / 1000.0) end"),
)


def named(use: str) -> dict[str, Metric]:
    """The request metrics that can carry ``use`` (one of `USES`) by short name, in declaration order."""
    if use not in USES:
        raise ValueError(f"no use {use!r} (known: {', '.join(USES)})")
    return {m.short: m for m in (*REQUEST, *DERIVED) if m.short and use in m.uses}


# The report's per-slice figures, in the order the tables show them.
REPORT: tuple[Metric, ...] = (
    Metric("n", "n", 0, "requests in the slice (failed ones too)", "", "id", "count", ok_only=False),
    Metric("n_errors", "err", 0, "failed requests", "", "error_class", "errors", ok_only=False),
    _ms("ttft_p50_ms", "TTFT p50", "median TTFT", "ttft_ms", "p50"),
    _ms("ttft_p90_ms", "p90", "90th percentile TTFT", "ttft_ms", "p90"),
    _ms("ttft_p99_ms", "p99", "99th percentile TTFT", "ttft_ms", "p99"),
    _ms("ttft_max_ms", "max", "slowest TTFT", "ttft_ms", "max"),
    _ms("e2e_mean_ms", "E2E mean", "mean E2E", "e2e_ms", "mean"),
    _ms("e2e_p50_ms", "p50", "median E2E", "e2e_ms", "p50"),
    _ms("e2e_p99_ms", "p99", "99th percentile E2E", "e2e_ms", "p99"),
    Metric("ttft_p50_delta_pct", "ΔTTFT p50 %", 1, "TTFT p50 against the baseline's same slice", "%", signed=True),
    Metric("e2e_mean_delta_pct", "ΔE2E mean %", 1, "E2E mean against the baseline's same slice", "%", signed=True),
    Metric("completion_tokens_mean", "out tokens", 0, "mean output tokens", "tokens", "completion_tokens", "mean"),
    Metric("tpot_p50_ms", "TPOT p50", 1, "median TPOT", "ms", "tpot_ms", "p50"),
    Metric("itl_p50_ms", "ITL p50", 1, "median of the per-request mean ITL", "ms", "itl_mean_ms", "p50"),
    _ms("srv_ttft_p50_ms", "server TTFT p50", "median server TTFT (queue + prefill)", "srv_ttft_ms", "p50"),
    _ms("srv_queue_p50_ms", "queue p50", "median server queue time", "srv_queue_ms", "p50"),
    _ms("srv_prefill_p50_ms", "prefill p50", "median server prefill time", "srv_prefill_ms", "p50"),
    _ms("srv_decode_p50_ms", "decode p50", "median server decode time", "srv_decode_ms", "p50"),
    Metric("kv_peak_pct", "KV peak %", 1, "highest KV-cache use sampled during the slice's requests", "%",
           "srv_kv_cache_usage_peak", "max_pct", ok_only=False),
    Metric("preemptions", "preempt", 0, "the server's preemption counter over the variant's run (all slice)"),
    Metric("requests_preempted", "req. preempted", 0, "requests during which the server preempted", "",
           "srv_preemptions", "positive", ok_only=False),
    Metric("goodput_pct", "goodput %", 0, "requests that succeeded and met every SLO given", "%"),
    _ms("ttft_sched_p99_ms", "TTFT from schedule p99", "open loop: TTFT from the scheduled arrival, 99th pct",
        "ttft_from_schedule_ms", "p99"),
    Metric("client_wait_p99_ms", "client wait p99", 0, "open loop: time a client-side cap held requests back", "ms",
           "client_wait_ms", "p99", ok_only=False),
)

# The study's summary table (one row per variant, at each variant's first load level).
STUDY: tuple[Metric, ...] = (
    Metric("n", "n", 0, "requests"), Metric("errors", "err", 0, "failed requests"),
    Metric("ttft_tax_all_pct", "TTFT tax %", 1, "TTFT against the baseline on every case (ratio of means)", "%",
           signed=True, ci_key="ttft_tax_all_ci_pct"),
    Metric("ttft_tax_short_pct", "TTFT tax short %", 1, "TTFT against the baseline on short prompts (ratio of means)",
           "%", signed=True),
    Metric("ttft_tax_medium_pct", "medium %", 1, "the same on medium prompts", "%", signed=True),
    Metric("ttft_tax_long_pct", "long %", 1, "the same on long prompts", "%", signed=True, ci_key="ttft_tax_long_ci_pct"),
    Metric("e2e_delta_medium_pct", "E2E Δ medium %", 1, "E2E against the baseline on medium generations", "%",
           signed=True, ci_key="e2e_delta_medium_ci_pct"),
    Metric("e2e_delta_all_pct", "E2E Δ %", 1, "E2E against the baseline on every case", "%", signed=True,
           ci_key="e2e_delta_all_ci_pct"),
    Metric("ttft_max_ms", "TTFT max", 0, "the slowest TTFT (the lone spike)", "ms"),
    Metric("kv_cache_peak_pct", "KV peak %", 1, "highest KV-cache use over the variant's run", "%"),
    Metric("kv_cache_mean_pct", "KV mean %", 1, "KV-cache use averaged over time", "%"),
    Metric("preemptions", "preempt", 0, "the server's preemptions over the variant's run"),
)

# Which report metrics each table shows (after the variant and slice columns).
LATENCY_TABLE = ("n", "n_errors", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_max_ms", "e2e_mean_ms",
                 "e2e_p50_ms", "e2e_p99_ms", "ttft_p50_delta_pct", "e2e_mean_delta_pct")
SERVER_TABLE = ("ttft_p50_ms", "srv_ttft_p50_ms", "srv_queue_p50_ms", "srv_prefill_p50_ms", "srv_decode_p50_ms",
                "tpot_p50_ms", "kv_peak_pct", "preemptions", "requests_preempted", "goodput_pct",
                "ttft_sched_p99_ms", "client_wait_p99_ms")
KEYS = (Metric("variant", "variant", None, "the variant"), Metric("complexity", "slice", None, "the case slice"))


def metrics(extra: tuple[Metric, ...] = ()) -> dict[str, Metric]:
    """key -> declaration: the request and report metrics, then ``extra`` (graders' columns)."""
    return {m.key: m for m in (*KEYS, *REQUEST, *STUDY, *REPORT, *extra)}


def cell(m: Metric, row: dict[str, Any]) -> str:
    """One value of a row with its interval beside it when the metric has one."""
    out = fmt(m, row.get(m.key))
    return out + (f" {fmt(m, row.get(m.ci_key))}" if m.ci_key and row.get(m.ci_key) else "")


def definitions_markdown(extra: tuple[Metric, ...] = ()) -> str:
    """The columns table docs/measuring.md carries between its `metrics` markers."""
    lines = ["| key | label | unit | meaning |", "|---|---|---|---|"]
    seen: set[str] = set()
    for m in (*REQUEST, *DERIVED, *REPORT, *STUDY, *extra):
        if m.key in seen:
            continue
        seen.add(m.key)
        lines.append(f"| `{m.key}` | {m.label} | {m.unit or '-'} | {m.meaning} |")
    return "\n".join(lines) + "\n"
