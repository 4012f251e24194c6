"""Multiple-choice items scored by log-likelihood (issue 49), teacher-forced on each variant's
server through the same prompt-logprobs path the divergence grader uses (`scoring.Scorer`): for
each choice item, the question as the context (`suites.choice.context`) and each option as the
assistant's continuation (`" " + option`), one scoring request an option. Each is a
`token_scores` row of kind `choice:K` (K the option's index), never a `requests` row; the report
picks the option with the highest summed log-probability (acc) and per character (acc_norm)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from ..ledger import Ledger
from ..ledger.mirror import MirroredLedger
from ..measure.scoring import OK, UNSUPPORTED, parse_prompt_logprobs, post_json, refused_prompt_logprobs, scoring_payload
from ..spec.matrix import Matrix
from .live import LiveVariant
from .scoring import Scorer
from .signals import STOP

CONCURRENCY = 4  # scoring requests in flight per server (prefill only: a server batches them)


def choice_items(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """The run's choice items: case id, question, options (from the cases' attributes)."""
    out = []
    for cid, f in ledger.case_fields(run_id, lean=True).items():
        a = json.loads(f.get("attributes_json") or "{}")
        if a.get("scoring") == "choice" and a.get("options") and a.get("question"):
            out.append({"case_id": cid, "question": a["question"], "options": a["options"]})
    return out


async def _score_option(sc: Scorer, http: aiohttp.ClientSession, item: dict[str, Any], k: int) -> None:
    lv = sc.lv
    msgs = [{"role": "user", "content": f"Question: {item['question'].strip()}\nAnswer:"}]
    body = scoring_payload(lv.served, msgs, " " + item["options"][k], 1)
    r, data = await post_json(http, f"{lv.base_url}/v1/chat/completions", body, lv.headers, sc.timeout_s, sc.epoch)
    if data is not None and r.error_class is None:
        r.usage = data.get("usage")
        r.prompt_tokens = (r.usage or {}).get("prompt_tokens")
        if not isinstance(data.get("prompt_logprobs"), list):
            r.error_class, r.error = "unsupported", "the answer carries no prompt_logprobs"
        elif (prefix := await sc._prefix(http, item["case_id"], msgs)) is None:
            r.error_class, r.error = "no_prefix", "neither /tokenize nor a prompt-only request gave a token count"
        else:
            r.prefix_tokens = prefix
            r.tokens, why = parse_prompt_logprobs(data, prefix, 1)
            if why:
                r.error_class, r.error = "unparsable", why
    r.status = OK if r.error_class is None else UNSUPPORTED if (
        r.error_class == "unsupported" or refused_prompt_logprobs(r)) else r.status
    sc._write({"case_id": item["case_id"], "id": None, "variant": None}, f"choice:{k}", CONCURRENCY, r, body)


async def _score_server(sc: Scorer, items: list[dict[str, Any]]) -> None:
    done = {(c, k) for k in range(8) for c in sc.ledger.scored_cases(sc.run_id, sc.lv.variant.name, f"choice:{k}")}
    gate = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def one(item: dict[str, Any], k: int) -> None:
            async with gate:
                if not (sc.unsupported or STOP.requested):
                    await _score_option(sc, http, item, k)

        await asyncio.gather(*(one(it, k) for it in items for k in range(len(it["options"]))
                               if (it["case_id"], k) not in done))


def score_choices(ledger: Ledger, run_id: str, matrix: Matrix, servers: dict[str, LiveVariant],
                  say: Callable[[str], None], epoch: float) -> None:
    """Every choice item's options scored on each live server of the group (one per variant)."""
    if STOP.requested or not (items := choice_items(ledger, run_id)):
        return
    if isinstance(ledger, MirroredLedger):
        say("choice items: no log-likelihood scoring under --ray yet: their accuracy is read generatively (letters)")
        return
    seen: set[str] = set()
    for lv in servers.values():
        if lv.variant.name in seen or lv.died:
            continue
        seen.add(lv.variant.name)
        sc = Scorer(ledger, run_id, matrix, lv, epoch)
        asyncio.run(_score_server(sc, items))
        what = f"no log-likelihood scoring ({sc.unsupported})" if sc.unsupported else \
            f"{sc.n} option log-likelihoods" + (f", {sc.n_err} failed" if sc.n_err else "")
        say(f"'{lv.variant.name}' choice items: {what}")
