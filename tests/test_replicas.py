"""Replicas: one variant served by several servers, its cases sharded over them, none lost or
duplicated, every row saying which server answered it."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.spec.matrix import Variant
from evalkit.testing.stub_server import StubConfig, StubServer


@pytest.mark.integration
def test_endpoints_shard_cases_over_two_servers(runner, write, ledger_path):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as b, \
            StubServer(StubConfig(ttft_ms=20, itl_ms=1)) as c:
        m = write("m.yaml", f"name: reps\nbaseline: base\ngeneration:\n  warmup: 1\n  baseline_repeats: 1\n"
                            f"variants:\n  - name: base\n    endpoints: [{a.base_url}, {b.base_url}]\n"
                            f"  - name: cand\n    endpoint: {c.base_url}\n")
        r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "12", "--ledger", str(ledger_path), "-q"])
        served = (a.cfg.counters["requests"], b.cfg.counters["requests"])
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    rows = list(db["requests"].rows_where("is_warmup = 0 and variant = 'base'"))
    assert len(rows) == 12
    assert len({x["case_id"] for x in rows}) == 12  # none lost, none duplicated
    assert Counter(x["replica"] for x in rows) == {0: 6, 1: 6}
    assert served[0] > 6
    assert served[1] > 6  # each server answered its shard plus its own warm-ups
    assert all(x["replica"] is None for x in db["requests"].rows_where("variant = 'cand'"))
    reps = list(db["replicas"].rows)
    assert sorted((x["variant"], x["replica"], x["status"]) for x in reps) == [("base", 0, "complete"),
                                                                                ("base", 1, "complete")]
    assert {x["replica"] for x in db["server_samples"].rows_where("variant = 'base'")} == {0, 1}
    rep = json.loads(runner.invoke(cli, ["report", "--json", "--ledger", str(ledger_path), "--by", "replica"]).output)
    by = {(s["variant"], s["replica"]): s["n"] for s in rep["findings"]["slices"]}
    assert by[("base", 0)] == 6
    assert by[("base", 1)] == 6


def test_replica_settings_are_checked():
    v = Variant(name="x", model="bundled:smollm2-135m-instruct", replicas=2,
                vllm_args=["--tensor-parallel-size", "2"])
    assert v.n_replicas == 2
    assert v.ray_resources() == {"num_gpus": 2.0, "num_cpus": 1.0}
    assert Variant(name="y", endpoints=["http://127.0.0.1:1"]).endpoint == "http://127.0.0.1:1"
    for bad in ({"name": "z", "endpoint": "http://a:1", "endpoints": ["http://b:1", "http://c:1"]},
                {"name": "z", "endpoint": "http://a:1", "replicas": 2}):
        try:
            Variant(**bad)
        except ValueError:
            continue
        raise AssertionError(bad)
