"""A ledger of N realistic request rows written straight into SQLite, so the report can be measured
at 10 M rows without sending 10 M requests (issue 37).

The run looks like a concurrency sweep of the shipped dataset (144 cases: short / medium / long
prompts, personas, formality levels) through several variants: each variant at every level, each
case repeated until N rows. Per request: TTFT = server queue + prefill (lognormal by complexity,
the queue growing with the level), TPOT and E2E from the output length, vLLM's own phases
(`srv_resp_*`, `srv_queue_ms`, `srv_prefill_ms`, `srv_decode_ms`), running / waiting at start, KV
use; about 0.5 % spikes (a preemption, a long queue or a cold prefill: each with the evidence the
report attributes it by), 0.3 % failed requests, and grades (schema pass, formality error) for
every successful one. Seeded: the same arguments give the same ledger.

    .venv/bin/python benchmarks/synth_ledger.py /tmp/synth.db --rows 200000
    .venv/bin/python benchmarks/synth_ledger.py /tmp/synth.db --rows 2000000 --levels 1,4,16 --variants base,w8a8,fp8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit import __version__  # noqa: E402
from evalkit.execution.load import Load  # noqa: E402
from evalkit.execution.patterns import Sweep  # noqa: E402
from evalkit.ledger import Ledger, open_ledger  # noqa: E402
from evalkit.ledger.store import dumps, utcnow  # noqa: E402
from evalkit.paths import default_dataset_path  # noqa: E402
from evalkit.spec.dataset import Case, dataset_hash, load_cases  # noqa: E402
from evalkit.spec.matrix import Matrix  # noqa: E402

CHUNK = 50_000  # rows generated and written at once: memory stays flat at any N
PREFILL_MS = {"short": 180.0, "medium": 420.0, "long": 1200.0}  # unloaded prefill by complexity
PROMPT_TOKENS = {"short": 220, "medium": 650, "long": 1600}
# variant -> (prefill factor, decode factor, quantization): a quantized variant decodes faster
VARIANTS = {"base": (1.0, 1.0, None), "w8a8": (0.97, 0.8, "w8a8"), "fp8": (1.03, 0.85, "fp8"),
            "int4": (1.1, 0.7, "awq")}
TPOT_MS = 56.0
SPIKE_SHARE, ERROR_SHARE = 0.005, 0.003


def case_row(c: Case, dhash: str) -> dict[str, Any]:
    a = c.attributes
    return {"id": c.id, "dataset_hash": dhash, "task": a.get("task"), "persona": a.get("persona"),
            "persona_title": a.get("persona_title"), "candidate": a.get("candidate"), "complexity": c.complexity,
            "formality": a.get("formality") if isinstance(a.get("formality"), int) else None,
            "schema_name": c.schema_name, "messages_json": dumps([m.model_dump() for m in c.messages]),
            "attributes_json": dumps(a)}


def make_run(db: Ledger, run_id: str, variants: list[str], levels: list[int], repeats: int,
             cases: list[Case]) -> None:
    dataset = default_dataset_path()
    dhash = dataset_hash(dataset)
    db.record_cases([case_row(c, dhash) for c in cases])
    matrix = Matrix.model_validate({
        "name": "synth", "baseline": variants[0], "generation": {"max_tokens": 256, "warmup": 0},
        "variants": [{"name": v, "endpoint": f"http://127.0.0.1:{8101 + i}"} for i, v in enumerate(variants)]})
    db.create_run({
        "id": run_id, "created_at": utcnow(), "finished_at": utcnow(), "status": "complete", "matrix_name": "synth",
        "matrix_json": matrix.model_dump_json(), "dataset_path": str(dataset), "dataset_hash": dhash,
        "n_cases": len(cases), "case_ids_json": dumps([c.id for c in cases]), "seed": 0,
        "evalkit_version": __version__, "source": "synth",
        "load_json": dumps({**Load(pattern=Sweep(tuple(levels))).record(), "repeats": repeats}),
    })
    for i, v in enumerate(variants):
        db.upsert_variant({"id": f"{run_id}:{v}", "run_id": run_id, "name": v, "is_baseline": int(i == 0),
                           "model": "synth/model", "engine": "vllm", "engine_version": "0.32.0",
                           "quantization": VARIANTS[v][2], "dtype": "bfloat16", "status": "complete",
                           "metrics_available": 1, "endpoint_url": f"http://127.0.0.1:{8101 + i}"})


def chunk_rows(rng: np.random.Generator, keys: np.ndarray, cases: list[Case], variants: list[str],
               levels: list[int], run_id: str, clock: dict[tuple[int, int], float]) -> tuple[list[dict], list[dict]]:
    """The request rows (and their grades) of one chunk of (variant, level, repeat, case) keys."""
    n = len(keys)
    vi, li, rep, ci = keys[:, 0], keys[:, 1], keys[:, 2], keys[:, 3]
    li = li.tolist()
    conc = np.asarray(levels)[keys[:, 1]]
    cx = [cases[k].complexity or "short" for k in ci]
    prefill0 = np.array([PREFILL_MS[c] for c in cx]) * np.array([VARIANTS[variants[v]][0] for v in vi])
    prefill = prefill0 * rng.lognormal(0.0, 0.15, n)
    queue = rng.exponential(1.0, n) * 25.0 * (conc - 1)
    tpot = TPOT_MS * np.array([VARIANTS[variants[v]][1] for v in vi]) * (1 + 0.04 * (conc - 1)) * rng.lognormal(0, 0.05, n)
    tokens = rng.integers(80, 256, n)
    # spikes: a third each preempted, queued long, or a cold / long prefill
    spike = rng.random(n) < SPIKE_SHARE
    kind = rng.integers(0, 3, n)
    factor = rng.uniform(3.0, 8.0, n)
    preempt = np.where(spike & (kind == 0), 1.0, 0.0)
    queue = np.where(spike & (kind == 1), queue + prefill * factor, queue)
    prefill = np.where(spike & (kind == 2), prefill * factor, prefill)
    tpot = np.where(preempt > 0, tpot * 1.5, tpot)
    ttft = queue + prefill + np.where(preempt > 0, prefill * factor, 0.0) + rng.uniform(2.0, 6.0, n)
    decode = tokens * tpot
    e2e = ttft + decode
    failed = rng.random(n) < ERROR_SHARE
    waiting = np.where(spike & (kind == 1), np.maximum(1, conc // 2), rng.integers(0, 2, n) * (conc > 1))
    running = np.minimum(conc - 1, rng.integers(0, conc, n))
    kv_peak = np.minimum(0.98, 0.05 + 0.04 * conc * rng.uniform(0.8, 1.2, n))
    formality_err = rng.choice([-2, -1, 0, 0, 0, 1, 1, 2], n)
    schema_pass = rng.random(n) < np.array([0.6 if variants[v] == "base" else 0.55 for v in vi])
    ptok = (np.array([PROMPT_TOKENS[c] for c in cx]) + rng.integers(-40, 40, n)).tolist()
    req = [int(cases[k].attributes.get("formality") or 3) for k in ci]
    # plain lists: a million numpy scalars cost more than the rows
    vi_, ci_, rep_, conc_ = vi.tolist(), ci.tolist(), rep.tolist(), conc.tolist()
    ttft_, e2e_, tpot_, tok_ = ttft.tolist(), e2e.tolist(), tpot.tolist(), tokens.tolist()
    queue_, prefill_, decode_ = queue.tolist(), prefill.tolist(), decode.tolist()
    run_, wait_, kv_, pre_ = running.tolist(), waiting.tolist(), kv_peak.tolist(), preempt.tolist()
    failed_, err_, schema_ = failed.tolist(), formality_err.tolist(), schema_pass.tolist()
    names, ids = variants, [c.id for c in cases]
    rows, grades = [], []
    for j in range(n):
        key = (vi_[j], li[j])
        start = clock.get(key, 0.0)
        clock[key] = start + e2e_[j] / conc_[j]  # a closed loop of c: c requests overlap
        ok = not failed_[j]
        rows.append({
            "run_id": run_id, "variant": names[vi_[j]], "case_id": ids[ci_[j]], "repeat": rep_[j],
            "is_warmup": 0, "final": 1, "attempt": 0, "level": f"c={conc_[j]}", "concurrency": conc_[j],
            "replica": 0, "mono_start_ms": start, "timestamp_source": "kernel", "timing_suspect": 0,
            "prompt_tokens": ptok[j],
            "ttft_ms": ttft_[j] if ok else None, "e2e_ms": e2e_[j] if ok else None,
            "tpot_ms": tpot_[j] if ok else None, "itl_mean_ms": tpot_[j] if ok else None,
            "completion_tokens": tok_[j] if ok else None, "finish_reason": "stop" if ok else None,
            "error_class": None if ok else ("timeout" if j % 2 else "http_5xx"),
            "error": None if ok else "synthesized failure", "srv_method": "response",
            "srv_queue_ms": queue_[j], "srv_prefill_ms": prefill_[j], "srv_decode_ms": decode_[j],
            "srv_resp_queue_ms": queue_[j], "srv_resp_prefill_ms": prefill_[j],
            "srv_running_start": run_[j], "srv_waiting_start": wait_[j],
            "srv_kv_cache_usage_peak": kv_[j], "srv_preemptions": pre_[j],
            "srv_ttft_ms": ttft_[j] - 3.0, "client_lag_max_ms": 0.4,
        })
        grades.append({"schema": schema_[j], "err": err_[j], "req": req[j], "v": vi_[j], "rep": rep_[j]} if ok else None)
    return rows, grades


def synthesize(path: Path, n: int, variants: list[str], levels: list[int], seed: int = 0,
               drift: bool = False) -> dict[str, Any]:
    """Write a run of about ``n`` measured rows into the ledger at ``path``; returns what was written.
    ``drift``: drift grades too (a candidate's against the baseline, the baseline's repeat 1 its
    noise floor), as a run with the default graders has them."""
    t0 = time.monotonic()
    cases = load_cases(default_dataset_path())
    per_pass = len(variants) * len(levels) * len(cases)
    repeats = max(1, -(-n // per_pass))
    db = open_ledger(path)
    run_id = f"synth-{n}-{seed}"
    make_run(db, run_id, variants, levels, repeats, cases)
    rng = np.random.default_rng(seed)
    # every (variant, level, repeat, case) in the runner's order, the first n of them
    grid = np.stack(np.meshgrid(np.arange(len(variants)), np.arange(len(levels)), np.arange(repeats),
                                np.arange(len(cases)), indexing="ij"), axis=-1).reshape(-1, 4)[:n]
    clock: dict[tuple[int, int], float] = {}
    seq = 0
    written = graded = 0
    for s in range(0, len(grid), CHUNK):
        rows, grades = chunk_rows(rng, grid[s:s + CHUNK], cases, variants, levels, run_id, clock)
        for r in rows:
            seq += 1
            r["seq"] = seq
        db.insert_requests(rows)
        written += len(rows)
        graded += _grades(db, run_id, rows, grades, db.request_ids(run_id, rows[0]["seq"], rows[-1]["seq"]), drift)
    _series(db, run_id, variants, levels, clock)
    return {"run_id": run_id, "rows": written, "grades": graded, "repeats": repeats, "seconds": time.monotonic() - t0,
            "mb": path.stat().st_size / 2**20}


def _grades(db: Ledger, run_id: str, rows: list[dict], grades: list[Any], ids: list[int], drift: bool) -> int:
    out = []
    now = utcnow()
    for rid, g in zip(ids, grades, strict=True):
        if g is None:
            continue
        out.append({"request_id": rid, "run_id": run_id, "grader": "schema", "grader_version": "1",
                    "value": float(g["schema"]), "passed": int(g["schema"]), "created_at": now})
        predicted = min(5, max(1, g["req"] + g["err"]))
        out.append({"request_id": rid, "run_id": run_id, "grader": "formality", "grader_version": "2",
                    "value": float(predicted), "passed": int(abs(g["err"]) <= 1), "created_at": now,
                    "detail_json": json.dumps({"requested": g["req"], "predicted": predicted,
                                               "error": predicted - g["req"]})})
        kind = "drift" if g["v"] else "noise_floor" if g["rep"] == 1 else None
        if drift and kind:  # 1 - cosine, spread without drawing from the rows' generator
            x = (0.03 if g["v"] else 0.02) + 0.02 * ((rid * 2654435761) % 1009) / 1009
            out.append({"request_id": rid, "run_id": run_id, "grader": "drift", "grader_version": "4",
                        "value": 1.0 - x, "created_at": now, "detail_json": json.dumps({"kind": kind, "drift": x})})
    db.insert_grade_rows(out)
    return len(out)


def _series(db: Ledger, run_id: str, variants: list[str], levels: list[int], clock: dict[tuple[int, int], float]) -> None:
    """KV-cache use and the preemption counter, one sample a second per variant (a level after another)."""
    rows = []
    for vi, v in enumerate(variants):
        t = 0.0
        for li, c in enumerate(levels):
            span = clock.get((vi, li), 0.0)
            for k in range(0, int(span // 1000) + 1, max(1, int(span // 1000) // 500 or 1)):
                rows.append({"run_id": run_id, "variant": v, "mono_ms": t + k * 1000.0, "series": "kv_cache_usage_perc",
                             "value": min(0.98, 0.05 + 0.04 * c), "replica": 0})
            t += span
        rows.append({"run_id": run_id, "variant": v, "mono_ms": 0.0, "series": "num_preemptions_total", "value": 0.0,
                     "replica": 0})
        rows.append({"run_id": run_id, "variant": v, "mono_ms": t, "series": "num_preemptions_total",
                     "value": float(len(levels)), "replica": 0})
    db.insert_server_samples(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--variants", default="base,w8a8,fp8")
    ap.add_argument("--levels", default="1,4,16", help="the sweep's concurrency levels")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drift", action="store_true", help="drift grades too, as the default graders write them")
    a = ap.parse_args()
    if a.path.exists():
        a.path.unlink()
    print(json.dumps(synthesize(a.path, a.rows, a.variants.split(","), [int(x) for x in a.levels.split(",")], a.seed,
                                a.drift)))


if __name__ == "__main__":
    main()
