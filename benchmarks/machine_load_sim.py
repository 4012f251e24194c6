"""Latency verdicts under a moving machine, through the real ordering and verdict code (issue 47):
for each order (alternate one request at a time, alternate at a loaded level's chunks, blocks,
sequential) and background load (`machine_sim.BACKGROUNDS`),
seeded runs at the margin (true ratio +5 %) and at no difference, each sent in the exact order
the real `Work` iterator yields, timed on a virtual clock (`evalkit.testing.machine_sim`), written
into a real ledger with its load samples, read for the machine check (`timeshare.machine_time`:
what `timeshare` tells the verdicts, without its A/A bootstrap; ``--timeshare``: the whole of it)
and decided by `verdicts`. Per
cell: the share of wrong verdicts, of undecided ones (the machine check caught the load) and of
inconclusive ones; "unchecked" reads the same runs without the machine check; "by case" reads
them unchecked with each case its own pair, as if the blocks of a loaded level or of `blocks`
were not there (what the verdicts did before they paired by block).

    python benchmarks/machine_load_sim.py [--sims 400] [--cases N] [--json out.json]

Each order's default number of cases (`CASES`) gives its verdicts enough pairs to decide: a loaded
level's and a blocks run's pairs are their chunks.

The table in docs/verdicts.md ("Paired in time") was printed by this script (seeded).
tests/test_machine_sim.py uses the driver below on fewer runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from evalkit.execution.load import Load, RunPolicy, Work, WorkItem  # noqa: E402
from evalkit.execution.order import MIN_BLOCK, Order, balanced, chunks  # noqa: E402
from evalkit.grading.margins import pairs_needed  # noqa: E402
from evalkit.host import host_line, this_host  # noqa: E402
from evalkit.ledger import Ledger, dumps, open_ledger  # noqa: E402
from evalkit.reporting.timeshare import machine_time, timeshare  # noqa: E402
from evalkit.reporting.verdicts import parse_margins, verdicts  # noqa: E402
from evalkit.spec.dataset import Case, Message  # noqa: E402
from evalkit.spec.matrix import Matrix  # noqa: E402
from evalkit.testing.machine_sim import BACKGROUNDS, Machine, Sim, simulate, wrong  # noqa: E402

ORDERS = ("alternate", "loaded", "blocks", "sequential")
MARGIN = "+5%"
SPECS = parse_margins({"e2e_mean": MARGIN})
LOADED = 4  # the loaded level's concurrency ("loaded": alternated chunk by chunk, sent on the virtual clock in turn)
CASES = {"alternate": 24, "loaded": 96, "blocks": 72, "sequential": 24}  # 24 pairs; 8 chunks of 12; 12 blocks of 6
RATIOS = {"margin": 1.05, "zero": 1.0}


def matrix(baseline_repeats: int = 2) -> Matrix:
    """Two endpoint variants (nothing is sent: the clock is virtual); the baseline's noise-floor
    pass on, as by default."""
    return Matrix.model_validate({"name": "sim", "baseline": "base", "generation": {"baseline_repeats": baseline_repeats},
                                  "variants": [{"name": "base", "endpoint": "http://127.0.0.1:9"},
                                               {"name": "cand", "endpoint": "http://127.0.0.1:9"}]})


def cases(n: int) -> list[Case]:
    return [Case(id=f"c{i:03d}", messages=[Message(role="user", content=f"case {i}")]) for i in range(n)]


def sending_order(kind: str, n_cases: int, seed: int, repeats: int = 1) -> tuple[list[WorkItem], Load]:
    """The measured items of a level in the order a run of this kind sends them, as
    `skeleton.run_variants` and `blocks.run_blocks` make its groups: alternate, one group of every
    variant; loaded, a level of concurrency `LOADED` alternated chunk by chunk (its chunks sized
    for the margins' pairs, as a run sizes them); sequential, one group per variant, baseline
    first; blocks, chunks of `MIN_BLOCK` cases to each variant in balanced order, each a group
    stamped (block, position)."""
    m, cs = matrix(), cases(n_cases)
    order = Order("alternate" if kind == "loaded" else kind, seed=seed, min_blocks=max(4, pairs_needed(SPECS)))
    load = Load(policy=RunPolicy(order=order))
    names = [v.name for v in m.ordered_variants()]
    if kind == "alternate":
        return list(Work(m, names, cs, repeats, load)), load
    if kind == "loaded":
        return list(Work(m, names, cs, repeats, load, concurrency=LOADED, sequential=False)), load
    if kind == "sequential":
        return [it for name in names for it in Work(m, [name], cs, repeats, load)], load
    if kind != "blocks":
        raise ValueError(f"no one-at-a-time order {kind!r}")
    order, out = load.policy.order, []
    perms = balanced(names, order.seed)
    for b, part in enumerate(chunks(cs, max(order.chunk, MIN_BLOCK))):  # as run_blocks cuts them
        for pos, name in enumerate(next(perms)):
            out += Work(m, [name], part, repeats, load, stamp=(b, pos))
    return out, load


class SimLedger:
    """One real ledger for many simulated runs (each its run id): the host row the machine
    check's bar reads, each run's load record (its order), variants, requests and samples."""

    def __init__(self, path: Path, machine: Machine) -> None:
        self.ledger: Ledger = open_ledger(path)
        self.host_id = self.ledger.record_host({"id": "sim-host", "cpu_model": "simulated", "threads": machine.host_cores,
                                                "cores": machine.host_cores})
        self.n = 0

    def write(self, sim: Sim, load: Load, repeats: int = 1) -> str:
        self.n += 1
        run_id = f"sim{self.n}"
        led = self.ledger
        led.create_run({"id": run_id, "created_at": f"2026-01-01T00:00:00.{self.n:06d}", "status": "complete",
                        "host_id": self.host_id, "load_json": dumps({**load.record(), "repeats": repeats})})
        for name, base in (("base", 1), ("cand", 0)):
            led.upsert_variant({"id": f"{run_id}:{name}", "run_id": run_id, "name": name, "is_baseline": base,
                                "status": "complete"})
        led.insert_requests([{**r, "run_id": run_id} for r in sim.rows])
        led.insert_env_samples([{**s, "run_id": run_id} for s in sim.samples])
        return run_id

    def close(self) -> None:
        self.ledger.close()


def one(db: SimLedger | None, kind: str, background: str, ratio: float, seed: int, n_cases: int,
        machine: Machine = Machine(), full: bool = False) -> dict[str, Any]:
    """One simulated run, decided with the machine check (its ledger read by `machine_time`, or
    the whole `timeshare` when ``full``) and without. The machine check only ever turns a verdict
    undecided, so the verdict without it is asked again only then."""
    items, load = sending_order(kind, n_cases, seed)
    sim = simulate(items, background, ratio, seed, machine=machine)
    by_case = verdicts([{**r, "order_block": None} for r in sim.rows], "base", SPECS)[0]["verdict"]
    if db is None:
        e = verdicts(sim.rows, "base", SPECS)[0]
        return {"unchecked": e["verdict"], "estimate": float(e["estimate"]), "cause": None, "checked": None,
                "by_case": by_case}
    run_id = db.write(sim, load)
    time = timeshare(db.ledger, run_id, "base", SPECS) if full else machine_time(db.ledger, run_id, "base")
    e = verdicts(sim.rows, "base", SPECS, time=time)[0]
    plain = e["verdict"] if e["verdict"] != "undecided" else verdicts(sim.rows, "base", SPECS)[0]["verdict"]
    return {"unchecked": plain, "estimate": float(e["estimate"]), "cause": e.get("machine"), "checked": e["verdict"],
            "by_case": by_case}


def cell(db: SimLedger | None, kind: str, background: str, at: str, sims: int, n_cases: int, seed0: int = 0,
         machine: Machine = Machine(), full: bool = False) -> dict[str, Any]:
    """Counts of each verdict, with the machine check and without, over ``sims`` seeded runs."""
    checked: Counter[str] = Counter()
    unchecked: Counter[str] = Counter()
    by_case: Counter[str] = Counter()
    for k in range(sims):
        r = one(db, kind, background, RATIOS[at], seed0 + k, n_cases, machine, full)
        unchecked[r["unchecked"]] += 1
        by_case[r["by_case"]] += 1
        if r["checked"] is not None:
            checked[r["checked"]] += 1
    margin = at == "margin"
    return {"order": kind, "background": background, "at": at, "sims": sims, "cases": n_cases,
            "checked": dict(checked), "unchecked": dict(unchecked),
            "wrong": sum(n for v, n in checked.items() if wrong(v, margin)),
            "wrong_unchecked": sum(n for v, n in unchecked.items() if wrong(v, margin)),
            "wrong_by_case": sum(n for v, n in by_case.items() if wrong(v, margin)),
            "undecided": checked.get("undecided", 0), "inconclusive": checked.get("inconclusive", 0)}


def exact_ci(k: int, n: int) -> str:
    """Clopper-Pearson 95 % interval of a simulated rate, in %."""
    lo = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
    hi = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
    return f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--cases", type=int, default=None, help="cases a run (default: each order's own, CASES)")
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--backgrounds", default=",".join(BACKGROUNDS))
    ap.add_argument("--json", type=Path, default=None, help="write every cell's counts here")
    ap.add_argument("--timeshare", action="store_true", help="the whole of `timeshare` per run (A/A control and "
                    "position effect too: about twice as slow)")
    a = ap.parse_args()
    t0 = time.monotonic()
    host = host_line(this_host())
    print(f"processor: {host}", flush=True)
    print(f"e2e_mean {MARGIN}, baseline x2 (noise floor), {a.sims} seeded runs a cell; {Machine()}", flush=True)
    print("| order | cases | background | wrong at the margin | undecided | inconclusive | wrong, unchecked | "
          "wrong, by case | wrong at no difference | undecided | wrong, unchecked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        db = SimLedger(Path(tmp) / "sim.db", Machine())
        try:
            for kind in a.orders.split(","):
                for bg in a.backgrounds.split(","):
                    nc = a.cases or CASES[kind]
                    m = cell(db, kind, bg, "margin", a.sims, nc, seed0=1_000_000, full=a.timeshare)
                    z = cell(db, kind, bg, "zero", a.sims, nc, seed0=2_000_000, full=a.timeshare)
                    cells += [m, z]
                    n = a.sims
                    by_case = pct(m["wrong_by_case"], n) if kind in ("loaded", "blocks") else "="
                    print(f"| {kind} | {nc} | {bg} | {exact_ci(m['wrong'], n)} | {pct(m['undecided'], n)} | "
                          f"{pct(m['inconclusive'], n)} | {pct(m['wrong_unchecked'], n)} | {by_case} | "
                          f"{exact_ci(z['wrong'], n)} | {pct(z['undecided'], n)} | {pct(z['wrong_unchecked'], n)} |",
                          flush=True)
        finally:
            db.close()
    took = time.monotonic() - t0
    print(f"\n{a.sims} seeded runs a cell, {took:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"host": host, "seconds": took, "margin": MARGIN, "machine": str(Machine()),
                                      "cells": cells}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
