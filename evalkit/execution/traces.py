"""Trace replay: a trace's rows become requests sent at their recorded offsets (divided by
`--speedup`), open loop, through the same sender as `--rate`. Rows that give only lengths get
prompts of exactly that many tokens by the variant's tokenizer (chat template included), cut
from the dataset's own text; equal Mooncake `hash_ids` become identical 512-token blocks, so the
sharing the trace recorded is what a prefix cache sees. Each request asks for the recorded output
length and ignores EOS, so it gets it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Any

from ..engines.bundled import BF16, PREFIX, resolve_model
from ..paths import default_dataset_path
from ..spec.dataset import Case, Message
from ..spec.matrix import Matrix, arg_value
from ..spec.spool import SpooledCases
from ..spec.traces import BLOCK_TOKENS, TraceError, TraceRow, iter_trace


@dataclass
class TraceSpec:
    path: str
    format: str
    speedup: float = 1.0
    limit: int | None = None


def tokenizer_for(matrix: Matrix, say: Any = lambda s: None) -> tuple[Any, str]:
    """The first launched variant's tokenizer; for endpoints that name none, the bundled model's."""
    for v in matrix.variants:
        if v.launched and v.model:
            path = resolve_model(v.model, say=say)
            if Path(path).is_dir():
                return _tok(path), f"{v.name}'s tokenizer ({v.model})"
    path = resolve_model(PREFIX + BF16, say=say)
    return _tok(path), f"the bundled {BF16} tokenizer (the endpoints name none)"


@lru_cache(maxsize=4)
def _tok(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@lru_cache(maxsize=2)
def _stream(path: str) -> list[int]:
    """The dataset's own text as one stream of token ids: the material prompts are cut from."""
    rows = [json.loads(x) for x in Path(default_dataset_path()).read_text(encoding="utf-8").splitlines() if x]
    text = "\n\n".join(m["content"] for r in rows for m in r["messages"] if m["role"] == "user")
    return list(_tok(path).encode(text, add_special_tokens=False))


def _count(tok: Any, content: str) -> int:
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def exact_prompt(tok: Any, ids: list[int], target: int) -> str:
    """User text whose chat-templated prompt is exactly ``target`` tokens (a few rounds of
    trimming or padding: token boundaries can merge when text is joined)."""
    overhead = _count(tok, "x") - 1
    n = max(1, target - overhead)
    text = tok.decode(ids[:n])
    for _ in range(6):
        got = _count(tok, text)
        if got == target:
            break
        n = max(1, n + (target - got))
        text = tok.decode(ids[:n])
    return text


def build_cases(rows: Iterable[TraceRow], load_tokenizer: Callable[[], tuple[Any, str]], max_model_len: int | None,
                path: str) -> Iterator[Case]:
    """Each trace row as a case, made as the rows come; the tokenizer (and its path) loaded when
    the first row without messages needs it."""
    tok: Any = None
    stream: list[int] = []
    span = 1
    seen: set[int] = set()
    for r in rows:
        if r.messages is not None:
            msgs = [Message(**m) for m in r.messages]
            shared = 0
        else:
            if tok is None:
                tok, tok_path = load_tokenizer()
                stream = _stream(tok_path)
                span = max(1, len(stream) - BLOCK_TOKENS)
            need = (r.input_tokens or 1)
            if max_model_len and need + (r.output_tokens or 0) > max_model_len:
                raise TraceError(f"{path}:{r.index}: input {need} + output {r.output_tokens} tokens is beyond "
                                 f"--max-model-len {max_model_len}")
            n_blocks = math.ceil(need / BLOCK_TOKENS)
            ids = list(r.hash_ids[:n_blocks]) + [-(r.index * 1000 + k) for k in range(n_blocks - len(r.hash_ids))]
            toks: list[int] = []
            prefix_seen = True
            shared = 0
            for h in ids:
                start = (h * 7919) % span if h >= 0 else (-h * 104729) % span
                toks += stream[start:start + BLOCK_TOKENS]
                if prefix_seen and h >= 0 and h in seen:
                    shared += BLOCK_TOKENS  # a prefix cache can reuse a leading run of blocks seen before
                else:
                    prefix_seen = False
            seen.update(h for h in ids if h >= 0)
            if _count(tok, "x") >= need:
                raise TraceError(f"{path}:{r.index}: field 'input_length': {need} tokens is shorter than the chat "
                                 "template itself")
            msgs = [Message(role="user", content=exact_prompt(tok, toks, need))]
            shared = min(shared, need)
        length = r.input_tokens or 0
        yield Case(
            id=r.id or f"trace-{r.index:06d}", messages=msgs, attributes={"task": "trace"},
            complexity="short" if length < 400 else "medium" if length < 1000 else "long",
            max_tokens=r.output_tokens, meta={"trace_row": r.index, "trace_input_tokens": r.input_tokens,
                                              "trace_output_tokens": r.output_tokens, "designed_shared_tokens": shared})


def trace_cases(spec: TraceSpec, matrix: Matrix, say: Any = lambda s: None) -> tuple[SpooledCases, list[float], str]:
    """The trace's requests as cases, their offsets (seconds, sped up), and whose tokenizer built
    them. Two passes over the file, neither holding it: the first checks every row (a bad row is
    found before minutes of prompt building), the second makes the cases and spools them to disk
    (`spec.spool`), the tokenizer loaded only if a row gives lengths, not messages."""
    path = Path(spec.path)
    offsets: list[float] = []
    ids: set[str] = set()  # the ids the trace gives itself (generated ones are unique by row)
    for r in _rows(path, spec):
        if r.id is not None:
            if r.id in ids:
                raise TraceError(f"{spec.path}:{r.index}: two rows share an id ({r.id})")
            ids.add(r.id)
        offsets.append(r.offset_s / spec.speedup)
    if not offsets:
        raise TraceError(f"{spec.path}: the trace has no rows")
    label = "messages as recorded"

    def tokenizer() -> tuple[Any, str]:
        nonlocal label
        tok, label = tokenizer_for(matrix, say)
        return tok, tok.name_or_path

    lens = [int(x) for v in matrix.variants if v.launched and (x := arg_value(v.vllm_args, "--max-model-len"))]
    cases = SpooledCases(build_cases(_rows(path, spec), tokenizer, min(lens) if lens else None, spec.path))
    return cases, offsets, label


def _rows(path: Path, spec: TraceSpec) -> Iterator[TraceRow]:
    rows = iter_trace(path, spec.format)
    return islice(rows, spec.limit) if spec.limit else rows


def trace_json(spec: TraceSpec, label: str) -> str:
    return json.dumps({**asdict(spec), "tokenizer": label})
