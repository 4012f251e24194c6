"""The matrix on a (local) Ray instance: the same rows as a local run, replicas sharded over
servers, a worker killed mid-run then --resume, ledgers merged, grades computed on Ray workers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.execution.cluster import FAULT_ENV
from evalkit.ledger import copy_ledger
from evalkit.testing.stub_server import StubConfig, StubServer

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module; each run's driver process joins it (RAY_ADDRESS)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
        yield
    ray.shutdown()


def _keys(ledger: Path) -> Counter:
    return Counter((r["variant"], r["case_id"], r["repeat"], r["level"], r["final"], r["error_class"])
                   for r in Database(ledger)["requests"].rows_where("is_warmup = 0"))


def _matrix(write, a: StubServer, b: StubServer, extra: str = "") -> Path:
    return write("m.yaml", f"name: rayed\nbaseline: base\ngeneration:\n  warmup: 1\n  baseline_repeats: 2\n"
                           f"variants:\n  - name: base\n    endpoint: {a.base_url}\n"
                           f"  - name: cand\n    endpoint: {b.base_url}\n{extra}")


def test_ray_run_has_the_same_rows_as_a_local_run(runner, write, tmp_path):
    faulty = StubConfig(ttft_ms=5, itl_ms=1, fault="http_500", fault_every=4)
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(faulty) as b:
        m = _matrix(write, a, b, "divergence: {enabled: false}\n")  # Ray workers do not score teacher-forced yet
        local, rayed = tmp_path / "local.db", tmp_path / "ray.db"
        r1 = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "6", "--ledger", str(local), "-q"])
        b.cfg.counters["requests"] = 0  # the same faults on the same requests
        r2 = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "6", "--ledger", str(rayed), "-q", "--ray"])
    assert r1.exit_code == 0, r2.output
    assert r2.exit_code == 0, r2.output
    assert _keys(local) == _keys(rayed)
    assert sum(k[5] == "http_500" for k in _keys(rayed).elements()) >= 1  # failed requests are rows there too
    db = Database(rayed)
    assert {v["status"] for v in db["variants"].rows} == {"complete"}
    assert all(v["host_id"] for v in db["variants"].rows)  # the worker's machine is recorded per variant
    assert db["server_samples"].count > 0
    seqs = [r["seq"] for r in db["requests"].rows]
    assert len(seqs) == len(set(seqs))
    # grades computed with embeddings on Ray workers equal the local ones for the same outputs
    g_local = {(r["variant"], r["case_id"], r["repeat"], r["grader"]): round(r["value"], 5) for r in Database(local).query(
        "select q.variant, q.case_id, q.repeat, g.grader, g.value from grades g join requests q on q.id = g.request_id")}
    g_ray = {(r["variant"], r["case_id"], r["repeat"], r["grader"]): round(r["value"], 5) for r in db.query(
        "select q.variant, q.case_id, q.repeat, g.grader, g.value from grades g join requests q on q.id = g.request_id")}
    assert g_local == g_ray
    assert {k[3] for k in g_ray} >= {"schema", "persona", "drift", "formality"}


def test_ray_replicas_split_cases_over_two_servers(runner, write, tmp_path):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as b:
        m = write("m.yaml", f"name: reps\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                            f"variants:\n  - name: base\n    endpoints: [{a.base_url}, {b.base_url}]\n")
        ledger = tmp_path / "l.db"
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "10", "--ledger", str(ledger), "-q",
                                "--ray", "--no-grade"])
        served = a.cfg.counters["requests"], b.cfg.counters["requests"]
    assert r.exit_code == 0, r.output
    rows = list(Database(ledger)["requests"].rows)
    assert len(rows) == 10
    assert len({x["case_id"] for x in rows}) == 10
    assert Counter(x["replica"] for x in rows) == {0: 5, 1: 5}
    assert served == (5, 5)


def test_worker_killed_mid_run_then_resume_leaves_one_row_per_request(runner, write, tmp_path, monkeypatch):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as b:
        m = _matrix(write, a, b, "divergence: {enabled: false}\n")  # Ray refuses teacher-forced scoring
        ledger = tmp_path / "l.db"
        monkeypatch.setenv(FAULT_ENV, "5")  # every worker dies after writing 5 requests (1 warm-up + 4)
        r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "6", "--ledger", str(ledger), "-q", "--ray"])
        assert r.exit_code == 1, r.output
        assert "Ray worker for 'base' failed" in r.output, r.output
        db = Database(ledger)
        run_id = next(db["runs"].rows)["id"]
        v = {x["name"]: x for x in db["variants"].rows}
        assert v["base"]["status"] == "failed"
        assert "Ray worker" in v["base"]["error"]
        assert all(x["status"] != "running" for x in v.values())  # a dead node leaves no variant "running"
        assert next(db["runs"].rows)["status"] != "running"
        assert 0 < db["requests"].count_where("is_warmup = 0") < 18  # what was streamed is kept
        monkeypatch.delenv(FAULT_ENV)
        r = runner.invoke(cli, ["run", "--resume", run_id, "--ledger", str(ledger), "-q", "--ray"])
    assert r.exit_code == 0, r.output
    keys = [k[:4] for k in _keys(ledger).elements() if k[4] == 1]
    assert len(keys) == 6 * 2 + 6
    assert len(set(keys)) == len(keys)  # every request once: base x2 + cand


def test_ledger_merge_of_two_half_runs_equals_the_whole(runner, write, tmp_path):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as b:
        whole_m = _matrix(write, a, b)
        whole, part = tmp_path / "whole.db", tmp_path / "part.db"
        assert runner.invoke(cli, ["run", "--matrix", str(whole_m), "--limit", "6", "--ledger", str(whole),
                                   "-q"]).exit_code == 0
        # the same run, resumed in a second place: a copy of it with the candidate's rows missing
        copy_ledger(whole, part)
        db = Database(part)
        run_id = next(db["runs"].rows)["id"]
        db.execute("delete from grades where request_id in (select id from requests where variant = 'cand')")
        db.execute("delete from requests where variant = 'cand'")
        db.conn.commit()
    out = tmp_path / "merged.db"
    r = runner.invoke(cli, ["ledger", "merge", str(part), str(whole), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "duplicates dropped 12" in r.output, r.output
    assert _keys(out) == _keys(whole)
    rep = lambda p: {(x["variant"], x["complexity"]): (x["n"], x["n_errors"], x["schema_pass_pct"])  # noqa: E731
                     for x in json.loads(runner.invoke(cli, ["report", "--json", "--run", run_id,
                                                             "--ledger", str(p)]).output)["rows"]}
    assert rep(out) == rep(whole)
    assert runner.invoke(cli, ["publish", "--out", str(tmp_path / "pub"), "--ledger", str(out)]).exit_code == 0
    r = runner.invoke(cli, ["ledger", "merge", str(part), "-o", str(tmp_path / "x.db")])
    assert r.exit_code == 2
    assert "at least two" in r.output
    r = runner.invoke(cli, ["ledger", "merge", str(part), str(whole), "-o", str(out)])
    assert r.exit_code == 2
    assert "exists" in r.output


def test_a_ray_run_s_ledger_has_its_client_self_check_rows(runner, write, tmp_path):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as b:
        ledger = tmp_path / "l.db"
        r = runner.invoke(cli, ["run", "--matrix", str(_matrix(write, a, b)), "--limit", "3", "--ledger", str(ledger),
                                "-q", "--ray", "--no-grade"])
    assert r.exit_code == 0, r.output
    assert Database(ledger)["client_lag"].count > 0
