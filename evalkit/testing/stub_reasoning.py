"""A stub that thinks first: reasoning deltas streamed before the answer, in either field name a
server uses (`reasoning_content`: vLLM up to 0.10, DeepSeek; `reasoning`: newer vLLM), a token a
chunk, as a reasoning model served by vLLM with a reasoning parser streams them (issue 49)."""

from __future__ import annotations

import asyncio
import json
from typing import Any


def _delta(rid: str, model: str, field: str, text: str) -> bytes:
    obj = {"id": rid, "object": "chat.completion.chunk", "model": model,
           "choices": [{"index": 0, "delta": {field: text}, "finish_reason": None}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def think(resp: Any, rid: str, model: str, chunks: int, field: str, itl_ms: float) -> int:
    """Stream ``chunks`` reasoning tokens, ``itl_ms`` apart; returns how many (the usage counts them)."""
    for k in range(chunks):
        if k:
            await asyncio.sleep(itl_ms / 1000)
        await resp.write(_delta(rid, model, field, f"step {k}. "))
    if chunks:
        await asyncio.sleep(itl_ms / 1000)  # the answer's first token comes a token later
    return chunks
