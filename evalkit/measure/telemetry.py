"""Server telemetry: scrape Prometheus /metrics, normalise names across engines and versions, keep
a time series in the ledger, and attribute what the server did to each request.

Canonical names drop the engine prefix (``vllm:``) and fold renames together:
``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc`` (vLLM < 0.9), ``time_per_output_token_seconds``
-> ``inter_token_latency_seconds`` (renamed in v1), and llama.cpp's ``llamacpp:`` names onto the
vLLM ones where the meaning matches. Series of unknown engines are kept under their raw names.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..ledger import Ledger, utcnow

# raw name -> canonical name, for names whose meaning survives a rename or another engine.
ALIASES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:time_per_output_token_seconds": "inter_token_latency_seconds",
    "llamacpp:kv_cache_usage_ratio": "kv_cache_usage_perc",
    "llamacpp:requests_processing": "num_requests_running",
    "llamacpp:requests_deferred": "num_requests_waiting",
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:tokens_predicted_total": "generation_tokens_total",
}
# When a server exposes both an old and a new name (deprecation windows), the new one wins.
PREFERRED = {"vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds"}
KNOWN_PREFIXES = ("vllm:", "llamacpp:")
# Labels that identify the server, not the quantity: summed over.
IDENTITY_LABELS = {"engine", "model_name"}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")
SKIP_SUFFIXES = ("_created",)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _float(s: str) -> float:
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    return float(s)  # also parses NaN


def parse_prometheus(text: str) -> list[Sample]:
    """Parse Prometheus text exposition (0.0.4). Comments and unparsable lines are skipped."""
    out: list[Sample] = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line.strip())
        if not m:
            continue
        name, labels_s, value_s = m.groups()
        try:
            value = _float(value_s)
        except ValueError:
            continue
        labels: tuple[tuple[str, str], ...] = ()
        if labels_s:
            labels = tuple(
                (k, v.replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n"))
                for k, v in _LABEL.findall(labels_s)
            )
        out.append(Sample(name, labels, value))
    return out


def canonical(name: str) -> str:
    """Canonical series name (histogram suffixes kept)."""
    for suffix in HIST_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in ALIASES or base.startswith(KNOWN_PREFIXES):
                return canonical(base) + suffix
    if name in ALIASES:
        return ALIASES[name]
    for p in KNOWN_PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def _base(name: str) -> str:
    for suffix in HIST_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def series_key(name: str, labels: Iterable[tuple[str, str]]) -> str:
    rest = sorted((k, v) for k, v in labels if k not in IDENTITY_LABELS)
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in rest) + "}" if rest else "")


def snapshot(samples: list[Sample]) -> dict[str, float]:
    """Canonical series key -> value, summed over identity labels (several engines, one model)."""
    has_preferred = {canonical(p) for p in PREFERRED if any(_base(s.name) == p for s in samples)}
    out: dict[str, float] = {}
    for s in samples:
        if s.name.endswith(SKIP_SUFFIXES) or s.name.endswith("_info"):
            continue
        base = _base(s.name)
        c = canonical(s.name)
        if base in ALIASES and base not in PREFERRED and canonical(base) in has_preferred:
            continue  # a deprecated duplicate of a series the server also exposes under its new name
        key = series_key(c, s.labels)
        out[key] = out.get(key, 0.0) + s.value
    return out


def info_labels(samples: list[Sample], name: str) -> dict[str, str]:
    """Labels of an ``*_info`` series such as vllm:cache_config_info (engine config as labels)."""
    for s in samples:
        if s.name == name or canonical(s.name) == canonical(name):
            return dict(s.labels)
    return {}


def histogram_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus-style quantile from cumulative buckets {le: count} (linear within a bucket)."""
    if not buckets:
        return None
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return les[-1]


def buckets_of(snap: dict[str, float], hist: str) -> dict[float, float]:
    prefix = f"{hist}_bucket{{"
    out: dict[float, float] = {}
    for k, v in snap.items():
        if k.startswith(prefix):
            m = re.search(r'le="([^"]+)"', k)
            if m:
                out[_float(m.group(1))] = out.get(_float(m.group(1)), 0.0) + v
    return out


# --- per-request attribution -------------------------------------------------------------------

HIST_FIELDS = {
    "srv_queue_ms": "request_queue_time_seconds",
    "srv_prefill_ms": "request_prefill_time_seconds",
    "srv_decode_ms": "request_decode_time_seconds",
    "srv_inference_ms": "request_inference_time_seconds",
    "srv_ttft_ms": "time_to_first_token_seconds",
    "srv_e2e_ms": "e2e_request_latency_seconds",
}
GAUGES_AT_START = {
    "srv_kv_cache_usage_start": "kv_cache_usage_perc",
    "srv_running_start": "num_requests_running",
    "srv_waiting_start": "num_requests_waiting",
}
SERVER_FIELDS = ["srv_method", *HIST_FIELDS, *GAUGES_AT_START, "srv_kv_cache_usage_peak", "srv_preemptions",
                 "srv_prompt_tokens", "srv_prefix_cache_hits", "srv_scrapes", "srv_waiting_peak", "srv_running_peak"]


# vLLM's per-request timing (--enable-per-request-metrics) -> the row's raw columns
RESPONSE_FIELDS = {
    "srv_resp_prefill_ms": "time_to_first_token_ms",  # from scheduling to the first token
    "srv_resp_queue_ms": "queue_time_ms",  # queued -> scheduled
    "srv_resp_generation_ms": "generation_time_ms",  # first -> last token
    "srv_resp_mean_itl_ms": "mean_itl_ms",
    "srv_resp_tokens_per_s": "tokens_per_second",
}


def response_timing(fields: dict[str, Any], timing: dict[str, Any] | None) -> dict[str, Any]:
    """Fold a request's own server timing into its server fields. The canonical fields keep one
    meaning whatever the source (srv_ttft_ms: arrival at the engine -> first token = queue +
    prefill; srv_prefill_ms: scheduled -> first token; srv_decode_ms: first -> last token); what
    the /metrics join said for the same request stays beside them (srv_hist_ttft_ms,
    srv_hist_queue_ms), so the two can be compared."""
    out = dict(fields)
    out["srv_hist_ttft_ms"], out["srv_hist_queue_ms"] = fields.get("srv_ttft_ms"), fields.get("srv_queue_ms")
    if not timing:
        return out
    raw = {col: timing.get(key) for col, key in RESPONSE_FIELDS.items()}
    out.update(raw)
    ttft, queue, gen = raw["srv_resp_prefill_ms"], raw["srv_resp_queue_ms"], raw["srv_resp_generation_ms"]
    if ttft is None:
        return out
    out.update({"srv_method": "response", "srv_prefill_ms": ttft,
                "srv_ttft_ms": ttft + (queue or 0.0), "srv_queue_ms": queue, "srv_decode_ms": gen,
                "srv_inference_ms": ttft + (gen or 0.0),
                "srv_e2e_ms": (queue or 0.0) + ttft + (gen or 0.0)})
    return out


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float | None:
    if key not in after:
        return None
    return after[key] - before.get(key, 0.0)


def attribute(before: dict[str, float], after: dict[str, float], method: str,
              peak_kv: float | None = None, scrapes: int | None = None,
              peaks: dict[str, float | None] | None = None) -> dict[str, Any]:
    """Server fields for one request (histogram_delta) or a time window (window: means over the
    requests that finished inside it). ``scrapes`` is how many /metrics samples fell inside the
    request: the KV peak is a sampled gauge, and this says how well it was sampled."""
    out: dict[str, Any] = {"srv_method": method}
    for f, hist in HIST_FIELDS.items():
        dsum, dcount = _delta(after, before, f"{hist}_sum"), _delta(after, before, f"{hist}_count")
        out[f] = dsum / dcount * 1000.0 if dsum is not None and dcount else None
    for f, g in GAUGES_AT_START.items():
        out[f] = before.get(g)
    out["srv_kv_cache_usage_peak"] = peak_kv
    out["srv_preemptions"] = _delta(after, before, "num_preemptions_total")
    out["srv_prompt_tokens"] = _delta(after, before, "prompt_tokens_total")
    out["srv_prefix_cache_hits"] = _delta(after, before, "prefix_cache_hits_total")
    out["srv_scrapes"] = scrapes
    out["srv_waiting_peak"] = (peaks or {}).get("num_requests_waiting")
    out["srv_running_peak"] = (peaks or {}).get("num_requests_running")
    return out


# --- the scraper --------------------------------------------------------------------------------


@dataclass
class Scrape:
    mono_ms: float
    values: dict[str, float]


@dataclass
class MetricsScraper:
    """Scrapes one server's /metrics on an interval into ``server_samples`` (changed values only)."""

    ledger: Ledger
    run_id: str
    variant: str
    base_url: str
    epoch: float  # perf_counter() origin shared with the request timings of this variant
    interval_s: float = 0.5
    headers: dict[str, str] = field(default_factory=dict)
    replica: int | None = None
    history: list[Scrape] = field(default_factory=list)
    last_samples: list[Sample] = field(default_factory=list)
    available: bool = True
    errors: int = 0  # scrapes that failed (timeout, refused, non-200, unparsable); the loop goes on
    dead_keys: dict[str, str] = field(default_factory=dict)  # histograms found absent or stuck: never waited for again
    last_error: str | None = None
    _last: dict[str, float] = field(default_factory=dict)
    _t: list[float] = field(default_factory=list)  # the history's times, for bisection
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def scrape(self, http: aiohttp.ClientSession) -> Scrape | None:
        if not self.available:
            return None
        try:
            async with http.get(f"{self.base_url}/metrics", headers=self.headers,
                                   timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status in (404, 405):  # no /metrics on this server: stop asking
                    self.available = False
                    return None
                if r.status != 200:
                    return self._failed(f"HTTP {r.status}")
                text = await r.text()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad scrape must not end the time series
            return self._failed(f"{type(e).__name__}: {e}".strip(": "))
        mono = (time.perf_counter() - self.epoch) * 1000.0
        self.last_samples = parse_prometheus(text)
        snap = snapshot(self.last_samples)
        ts = utcnow()
        changed = [
            {"run_id": self.run_id, "variant": self.variant, "replica": self.replica, "mono_ms": round(mono, 3), "ts": ts,
             "series": k, "value": v}
            for k, v in snap.items() if self._last.get(k) != v and not (isinstance(v, float) and math.isnan(v))
        ]
        self.ledger.insert_server_samples(changed)
        self._last = snap
        s = Scrape(mono, snap)
        self.history.append(s)
        self._t.append(mono)
        return s

    def _failed(self, why: str) -> None:
        self.errors += 1
        self.last_error = why[:300]
        return None

    async def run(self, http: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            try:
                await self.scrape(http)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - e.g. the ledger write; count it, keep sampling
                self._failed(f"{type(e).__name__}: {e}")
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()

    def restart(self) -> None:
        """Ready to `run` again, possibly in another event loop (each load level runs in its own
        `asyncio.run`, and an Event stays bound to the loop it was first awaited in)."""
        self._stop = asyncio.Event()

    def at(self, mono_ms: float) -> dict[str, float]:
        """The last scrape at or before a moment (or the first one)."""
        if not self.history:
            return {}
        i = bisect_right(self._t, mono_ms)
        return self.history[max(0, i - 1)].values

    def first_after(self, mono_ms: float) -> dict[str, float]:
        """The first scrape at or after a moment (or the last one)."""
        if not self.history:
            return {}
        i = bisect_left(self._t, mono_ms)
        return self.history[min(i, len(self.history) - 1)].values

    def _inside(self, start_ms: float, end_ms: float) -> list[Scrape]:
        times = self._t
        return self.history[bisect_left(times, start_ms):bisect_right(times, end_ms)]

    def scrapes_in(self, start_ms: float, end_ms: float) -> int:
        times = self._t
        return bisect_right(times, end_ms) - bisect_left(times, start_ms)

    def peaks(self, start_ms: float, end_ms: float) -> dict[str, float | None]:
        """The most requests waiting and running the server reported during a window."""
        return {s: self.peak(s, start_ms, end_ms) for s in ("num_requests_waiting", "num_requests_running")}

    def peak(self, series: str, start_ms: float, end_ms: float) -> float | None:
        """The gauge's largest value over a window: the samples inside it and the one it began with."""
        vals = [s.values[series] for s in self._inside(start_ms, end_ms) if series in s.values]
        before = self.at(start_ms).get(series)
        if before is not None:
            vals.append(before)
        return max(vals) if vals else None

    @property
    def last_ms(self) -> float | None:
        """When the latest scrape was taken (None before the first)."""
        return self.history[-1].mono_ms if self.history else None

    def forget_before(self, mono_ms: float) -> None:
        """Drop the scrapes no request still needs: all before a moment but the last one at or
        before it (what a request that began then starts from). A long run keeps a short history."""
        i = bisect_right(self._t, mono_ms) - 1
        if i > 0:
            del self.history[:i]
            del self._t[:i]

    async def wait_for_count(self, http: aiohttp.ClientSession, key: str, target: float,
                             timeout_s: float = 2.0) -> Scrape | None:
        """Scrape until a histogram count reaches ``target`` (the server records a request just
        after its last chunk is sent). A histogram the server does not have, or one that did not
        move in a whole ``timeout_s``, is found once: no later request waits for it (a bare
        endpoint's sequential requests would otherwise start ``timeout_s`` apart). Returns None then."""
        if key in self.dead_keys:
            return None
        deadline = time.perf_counter() + timeout_s
        s = None
        while time.perf_counter() < deadline:
            s = await self.scrape(http)
            if s is None:
                return s
            if key not in s.values:  # not a vLLM histogram this server keeps
                self.dead_keys[key] = "absent from /metrics"
                return None
            if s.values[key] >= target:
                return s
            await asyncio.sleep(0.02)
        self.dead_keys[key] = f"did not move in {timeout_s:g} s"
        return None


def engine_config(samples: list[Sample]) -> dict[str, Any]:
    """What the engine says about its KV cache (vllm:cache_config_info), for the variants table."""
    labels = info_labels(samples, "vllm:cache_config_info")
    return {k: v for k, v in labels.items() if k not in IDENTITY_LABELS}

