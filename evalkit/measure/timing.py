"""Client-side latency metrics, computed from the raw chunk timings stored per request.

Definitions (also in docs/measuring.md; tests pin each one):

- TTFT: send -> arrival of the first chunk whose delta carries a generated token of any kind:
  answer content, or reasoning (`reasoning_content`, or `reasoning` in newer vLLM). Role-only and
  empty chunks do not count (vLLM's first chunk is ``{"role": "assistant", "content": ""}``). vLLM's
  `bench serve` and AIPerf define it so: a model that thinks first has its first token early.
- TTFO: send -> arrival of the first chunk carrying answer content (time to first output): equal to
  TTFT for a model that does not reason; TTFO − TTFT is the reasoning time (`reasoning_ms`).
- E2E: send -> end of the stream (``[DONE]`` or connection close).
- ITL: the gaps between consecutive token-bearing chunks, reasoning and answer alike (TTFT
  excluded). One value per gap.
- TPOT: (E2E - TTFT) / (completion_tokens - 1), over reasoning and answer tokens alike (the
  server's usage counts both); undefined for fewer than 2 output tokens.
- Output tok/s: completion_tokens / E2E.
"""

from __future__ import annotations

from statistics import fmean


def ttft_ms(offsets_ms: list[float]) -> float | None:
    return offsets_ms[0] if offsets_ms else None


def itl_ms(offsets_ms: list[float]) -> list[float]:
    return [b - a for a, b in zip(offsets_ms, offsets_ms[1:], strict=False)]


def itl_mean_ms(offsets_ms: list[float]) -> float | None:
    gaps = itl_ms(offsets_ms)
    return fmean(gaps) if gaps else None


def tpot_ms(e2e: float | None, ttft: float | None, completion_tokens: int | None) -> float | None:
    if e2e is None or ttft is None or not completion_tokens or completion_tokens < 2:
        return None
    return (e2e - ttft) / (completion_tokens - 1)


def output_tps(e2e: float | None, completion_tokens: int | None) -> float | None:
    if not e2e or completion_tokens is None:
        return None
    return completion_tokens / (e2e / 1000.0)
