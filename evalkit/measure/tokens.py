"""Token counts when a server sends no usage chunk."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from .client import RequestResult


@lru_cache(maxsize=8)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def fill_token_counts(r: RequestResult, messages: list[dict[str, str]], model_path: str | None) -> None:
    """When the server sent no usage chunk: count with the model's own tokenizer if it is local
    (flagged `tokenizer`), else count content chunks (flagged `chunk_count`; vLLM streams about
    one token per chunk, other servers may not)."""
    if r.usage_source is not None or not (r.text or r.chunk_offsets_ms):
        return
    if model_path and Path(model_path).is_dir():
        try:
            tok = _tokenizer(model_path)
            r.completion_tokens = len(tok(r.text, add_special_tokens=False)["input_ids"])
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            r.prompt_tokens = len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            r.usage_source = "tokenizer"
            return
        except Exception:  # a tokenizer that cannot load is no reason to lose the row
            pass
    r.completion_tokens = len(r.chunk_offsets_ms)
    r.usage_source = "chunk_count"
