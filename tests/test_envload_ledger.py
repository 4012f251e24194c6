"""The `env_samples` table (m023): rows round-trip through the Ledger, the per-variant load
summaries joined to requests by time in SQL give known answers on hand-made rows, and the sampler
writes in batches as a thread (its own connection) and as an asyncio task (issue 47)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from evalkit.errors import UsageError
from evalkit.ledger import migrations, open_ledger
from evalkit.ledger.env import ENV_COLUMNS
from evalkit.measure.envload import EnvSampler
from evalkit.measure.gpuload import GpuReader


def sample_row(t_ms: float, **measures: Any) -> dict[str, Any]:
    return {"run_id": "r1", "t_ms": t_ms, "span_ms": 1000.0, "ts": "2026-01-01T00:00:00.000+00:00", **measures}


def request(variant: str, start_ms: float, e2e_ms: float | None, **extra: Any) -> dict[str, Any]:
    return {"run_id": "r1", "variant": variant, "case_id": "c", "repeat": 0, "is_warmup": 0, "final": 1,
            "level": "main", "mono_start_ms": start_ms, "e2e_ms": e2e_ms, **extra}


def test_the_migration_makes_the_table_and_its_index(ledger_path):
    open_ledger(ledger_path).close()
    db = Database(ledger_path)
    assert "m023_env_samples" in {m.name for m in migrations.applied(db)}
    assert set(db["env_samples"].columns_dict) == {"id", *ENV_COLUMNS}
    assert ["run_id", "t_ms"] in [i.columns for i in db["env_samples"].indexes]
    db.conn.close()


def test_rows_round_trip_and_a_stretch_reads_back(db):
    rows = [sample_row(t, foreign_cpu=t / 1000, gpu_throttle=None, variant_active="base") for t in (1000.0, 2000.0, 3000.0)]
    db.insert_env_samples(rows)
    db.insert_env_samples([])
    got = db.env_samples("r1", 1500.0, 3000.0)
    assert [(r["t_ms"], r["foreign_cpu"], r["variant_active"]) for r in got] == [(2000.0, 2.0, "base"), (3000.0, 3.0, "base")]
    assert len(db.env_samples("r1")) == 3
    assert db.env_samples("other") == []
    db.close()


@pytest.fixture
def loaded(db):
    """base sends 10 requests back to back over [0, 10 s], cand over [10, 20 s]; one sample a
    second. base: foreign 0 except 1.0 at its last second, steal 0, no iowait or GPU readings;
    cand: foreign 0.1 ... 1.0, steal 0.2, throttled in 2 of 10 samples. A cand warm-up over
    [20, 26 s] and a sample at 25 s that no measured request overlaps; `short`: one request shorter
    than the sampling interval, at level c=4."""
    db.create_run({"id": "r1", "status": "finished"})
    reqs = [request("base", i * 1000.0, 1000.0) for i in range(10)]
    reqs += [request("cand", 10000.0 + i * 1000.0, 1000.0) for i in range(10)]
    reqs += [request("cand", 20000.0, 6000.0, is_warmup=1), request("short", 30200.0, 100.0, level="c=4")]
    reqs += [request("base", 40000.0, 500.0, final=0)]  # a retried attempt: not measured
    db.insert_requests(reqs)
    rows = [sample_row(1000.0 * k, foreign_cpu=1.0 if k == 10 else 0.0, steal=0.0) for k in range(1, 11)]
    rows += [sample_row(10000.0 + 1000.0 * k, foreign_cpu=k / 10, steal=0.2, iowait=0.01,
                        gpu_throttle=0x40 if k in (3, 7) else 0) for k in range(1, 11)]
    rows += [sample_row(25000.0, foreign_cpu=5.0), sample_row(31000.0, foreign_cpu=0.3), sample_row(40400.0, foreign_cpu=9.0)]
    db.insert_env_samples(rows)
    yield db
    db.close()


@pytest.mark.parametrize("variant,key,value", [
    ("base", "samples", 10), ("base", "foreign_cpu_mean", 0.1), ("base", "foreign_cpu_p90", 0.0),
    ("base", "foreign_cpu_max", 1.0), ("base", "foreign_cpu_n", 10), ("base", "steal_mean", 0.0),
    ("base", "iowait_mean", None), ("base", "iowait_n", 0), ("base", "gpu_samples", 0), ("base", "throttle_share", None),
    ("base", "first_ms", 0.0), ("base", "last_ms", 10000.0),
    ("cand", "samples", 10), ("cand", "foreign_cpu_mean", 0.55), ("cand", "foreign_cpu_p90", 0.9),
    ("cand", "foreign_cpu_max", 1.0), ("cand", "steal_mean", 0.2), ("cand", "steal_p90", 0.2),
    ("cand", "iowait_max", 0.01), ("cand", "gpu_samples", 10), ("cand", "throttle_share", 0.2),
    ("cand", "first_ms", 10000.0), ("cand", "last_ms", 20000.0),
    ("short", "samples", 1), ("short", "foreign_cpu_mean", 0.3),
])
def test_load_while_each_variant_ran(loaded, variant, key, value):
    got = loaded.env_load("r1")[variant][key]
    assert got == (pytest.approx(value) if isinstance(value, float) else value)


def test_a_level_keeps_its_own_requests(loaded):
    assert set(loaded.env_load("r1", level="c=4")) == {"short"}
    assert set(loaded.env_load("r1", level="main")) == {"base", "cand"}


def test_a_variant_without_samples_is_there_with_nulls(loaded):
    loaded.insert_requests([request("late", 90000.0, 1000.0)])
    late = loaded.env_load("r1")["late"]
    assert (late["samples"], late["foreign_cpu_mean"], late["foreign_cpu_n"]) == (0, None, 0)


def test_a_variants_series_in_time_order(loaded):
    series = loaded.env_series("r1", "cand")
    assert [t for t, _ in series] == [10000.0 + 1000.0 * k for k in range(1, 11)]
    assert [v for _, v in series] == pytest.approx([k / 10 for k in range(1, 11)])


def test_a_series_of_an_unknown_measure_is_refused(loaded):
    with pytest.raises(UsageError, match="no load measure"):
        loaded.env_series("r1", "cand", "variant_active; drop table requests")


# --- the sampler writing ------------------------------------------------------------------------

PROC_STAT = "cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n"


def quiet_machine(root: Path) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/stat").write_text(PROC_STAT)


class Ticking:
    """Keeps a fixture /proc/stat moving (100 ticks of each kind a step) so each sample has an interval."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def step(self) -> None:
        self.n += 1
        k = 100 * self.n
        (self.root / "proc/stat").write_text(f"cpu  {100 + k} 0 100 {1000 + k} 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\n")


def no_gpu() -> GpuReader:
    return GpuReader(object())  # nothing NVML-like: nulls


def test_the_thread_writes_batches_through_its_own_connection(tmp_path, ledger_path):
    quiet_machine(tmp_path)
    ledger = open_ledger(ledger_path)
    s = EnvSampler(ledger, "r1", epoch=time.perf_counter(), root=tmp_path, own_pid=1, interval_s=0.05,
                   flush_every_s=0.15, gpu=no_gpu())
    s.start()
    s.set_active(["base"])
    time.sleep(0.6)
    during = len(ledger.env_samples("r1"))  # batches landed while it ran, before stop()
    s.stop()
    rows = ledger.env_samples("r1")
    assert during >= 2
    assert len(rows) == s.written >= 8
    assert rows[0]["variant_active"] == "base"
    assert [r["t_ms"] for r in rows] == sorted(r["t_ms"] for r in rows)
    assert all(r["span_ms"] > 0 for r in rows)
    assert s.errors == 0
    ledger.close()


def test_a_ledger_without_a_file_gets_the_rows_at_stop(tmp_path):
    quiet_machine(tmp_path)
    ledger = open_ledger(":memory:")
    s = EnvSampler(ledger, "r1", epoch=time.perf_counter(), root=tmp_path, own_pid=1, interval_s=0.05, gpu=no_gpu())
    s.start()
    time.sleep(0.3)
    assert ledger.env_samples("r1") == []
    s.stop()
    assert len(ledger.env_samples("r1")) >= 3
    ledger.close()


def test_as_an_asyncio_task(tmp_path, db):
    quiet_machine(tmp_path)
    tick = Ticking(tmp_path)
    s = EnvSampler(db, "r1", epoch=time.perf_counter(), root=tmp_path, own_pid=1, interval_s=0.05,
                   flush_every_s=0.1, gpu=no_gpu())

    async def main() -> None:
        task = asyncio.create_task(s.run())
        for _ in range(8):
            tick.step()
            await asyncio.sleep(0.05)
        s.stop()
        await task

    asyncio.run(main())
    rows = db.env_samples("r1")
    assert len(rows) == s.written >= 4
    assert any(r["busy_cpu"] is not None for r in rows)
    db.close()


def test_a_failed_write_keeps_the_rows_for_the_next_flush(tmp_path, db, monkeypatch):
    from evalkit.errors import LedgerWriteError

    s = EnvSampler(db, "r1", epoch=0.0, root=tmp_path, own_pid=1, gpu=no_gpu())
    s._pending.append(sample_row(1.0))
    real = db.insert_env_samples

    def locked(rows):
        raise LedgerWriteError("locked")

    monkeypatch.setattr(db, "insert_env_samples", locked)
    s.flush()
    monkeypatch.setattr(db, "insert_env_samples", real)
    s.flush()
    assert (s.errors, s.written, len(db.env_samples("r1"))) == (1, 1, 1)
    db.close()


def test_the_load_of_each_side_of_each_chunk_is_read_in_sql(db):
    # --order blocks: chunk 0's base block over [0, 10 s] under no foreign load, its cand block over
    # [10, 20 s] under one core; chunk 1 the other way round
    db.create_run({"id": "r1", "status": "finished"})
    reqs = [request(v, t0 + i * 1000.0, 1000.0, order_block=blk, order_position=pos)
            for blk, pos, v, t0 in ((0, 0, "base", 0.0), (0, 1, "cand", 10000.0), (1, 0, "cand", 20000.0),
                                    (1, 1, "base", 30000.0)) for i in range(10)]
    db.insert_requests(reqs)
    db.insert_env_samples([sample_row(1000.0 * t, foreign_cpu=1.0 if 10 < t <= 20 else 0.0, steal=0.0)
                           for t in range(1, 41)])
    got = {(r["variant"], r["block"]): round(r["foreign_cpu"], 2) for r in db.env_by_block("r1")}
    assert got == {("base", 0): 0.0, ("cand", 0): 1.0, ("cand", 1): 0.0, ("base", 1): 0.0}
    db.close()


def test_the_cpus_the_samples_measured(db):
    db.insert_env_samples([sample_row(1000.0, foreign_cpu=0.0, cpus=2), sample_row(2000.0, foreign_cpu=0.0, cpus=2)])
    assert db.env_cpus("r1") == 2
    db.close()


def test_samples_from_before_m026_measured_unknown_cpus(db):
    db.insert_env_samples([sample_row(1000.0, foreign_cpu=0.0)])
    assert db.env_cpus("r1") is None
    db.close()
