"""One road: the same stub workloads through every executor — this process with one, two and four
sending processes, and Ray — give the same (variant, case, repeat, turn) rows, the same grades
and the same run-record fields, timings aside. A new executor is done when it passes here."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.testing.stub_server import StubConfig, StubServer

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[1]
CONVERSATIONS = PROJECT / "data" / "resume_gen_conversations.jsonl"
TRACE = PROJECT / "data" / "traces" / "mooncake_sample.jsonl"
EXECUTORS = {"procs1": ["--client-procs", "1"], "procs2": ["--client-procs", "2"],
             "procs4": ["--client-procs", "4"], "ray": ["--ray", "--client-procs", "1"]}
RUN_FIELDS = ("matrix_name", "dataset_hash", "n_cases", "case_ids_json", "graders_json", "trace_json", "status")


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
        yield
    ray.shutdown()


@pytest.fixture(scope="module")
def stubs():
    with StubServer(StubConfig(model="a", ttft_ms=2, itl_ms=0)) as a, \
            StubServer(StubConfig(model="b", ttft_ms=2, itl_ms=0)) as b:
        yield a, b


def _matrix(tmp_path: Path, stubs, extra: str = "") -> Path:
    a, b = stubs
    p = tmp_path / "m.yaml"
    p.write_text("name: parity\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n  max_tokens: 32\n"
                 "  structured_output: false\ndivergence: {enabled: false}\n"
                 f"variants:\n  - name: base\n    endpoint: {a.base_url}\n  - name: cand\n    endpoint: {b.base_url}\n"
                 + extra, encoding="utf-8")
    return p


def _rows(ledger: Path) -> Counter:
    return Counter((r["variant"], r["case_id"], r["repeat"], r["turn"], r["final"], r["error_class"])
                   for r in Database(ledger).query("select * from requests where is_warmup = 0"))


def _grades(ledger: Path) -> dict:
    return {(g["variant"], g["case_id"], g["repeat"], g["grader"]): (g["passed"], round(g["value"] or 0.0, 6))
            for g in Database(ledger).query("select q.variant, q.case_id, q.repeat, g.grader, g.passed, g.value "
                                            "from grades g join requests q on q.id = g.request_id")}


def _run_record(ledger: Path) -> dict:
    run = next(Database(ledger).query("select * from runs"))
    return {k: run[k] for k in RUN_FIELDS}


def _each_executor(runner, tmp_path: Path, args: list[str], name: str) -> dict[str, Path]:
    out = {}
    for ex, flags in EXECUTORS.items():
        ledger = tmp_path / f"{name}-{ex}.db"
        r = runner.invoke(cli, [*args, "--ledger", str(ledger), "-q", *flags])
        assert r.exit_code == 0, f"{ex}: {r.output}"
        out[ex] = ledger
    return out


def test_conversations_keep_every_turn_on_every_executor(runner, tmp_path, stubs, ray_address):
    m = _matrix(tmp_path, stubs)
    got = _each_executor(runner, tmp_path, ["run", "--matrix", str(m), "--dataset", str(CONVERSATIONS), "--limit", "4",
                                            "--concurrency", "4", "--grader", "schema"], "conv")
    for ex, ledger in got.items():
        turns = Counter(r["turn"] for r in Database(ledger).query(
            "select turn from requests where is_warmup = 0 and variant = 'cand' and error_class is null"))
        assert turns == {0: 4, 1: 4, 2: 4}, ex  # four conversations, three turns each, every one sent
    first = _rows(got["procs1"])
    for ex, ledger in got.items():
        assert _rows(ledger) == first, ex


def test_later_turns_carry_the_variants_own_replies_from_sending_processes(runner, tmp_path):
    with StubServer(StubConfig(model="a", ttft_ms=1, itl_ms=0, keep_bodies=True, numbered=True)) as a:
        m = tmp_path / "m.yaml"
        m.write_text("name: p\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n  structured_output: false\n"
                     f"  max_tokens: 16\nvariants:\n  - name: base\n    endpoint: {a.base_url}\n", encoding="utf-8")
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--dataset", str(CONVERSATIONS), "--limit", "2",
                                "--concurrency", "2", "--client-procs", "2", "--no-grade", "-q",
                                "--ledger", str(tmp_path / "l.db")])
        assert r.exit_code == 0, r.output
        bodies = list(a.cfg.bodies)
    replies = [x["text"] for x in Database(tmp_path / "l.db").query("select text from requests where turn < 2")]
    histories = [m["content"] for b in bodies for m in b["messages"] if m["role"] == "assistant"]
    assert len(replies) == 4  # turns 0 and 1 of two conversations, each answered
    assert set(replies) <= set(histories)  # each went back to the server in its conversation's later turns


def test_grades_and_run_record_match_across_executors(runner, tmp_path, stubs, ray_address):
    m = _matrix(tmp_path, stubs)
    got = _each_executor(runner, tmp_path, ["run", "--matrix", str(m), "--limit", "6", "--concurrency", "2",
                                            "--grader", "schema", "--grader", "formality"], "cases")
    first = got["procs1"]
    for ex, ledger in got.items():
        assert _rows(ledger) == _rows(first), ex
        assert _grades(ledger) == _grades(first), ex
        assert _run_record(ledger) == _run_record(first), ex


def test_a_trace_replays_the_same_rows_and_is_recorded_on_every_executor(runner, tmp_path, stubs, ray_address):
    m = _matrix(tmp_path, stubs)
    got = _each_executor(runner, tmp_path, ["run", "--matrix", str(m), "--trace", str(TRACE), "--trace-format",
                                            "mooncake", "--speedup", "8", "--trace-limit", "12", "--no-grade"], "trace")
    first = got["procs1"]
    for ex, ledger in got.items():
        assert _rows(ledger) == _rows(first), ex
        assert _run_record(ledger)["trace_json"], ex


def test_a_workload_with_a_plugin_grader_is_remembered_on_every_executor(runner, tmp_path, stubs, ray_address,
                                                                           monkeypatch):
    a, b = stubs
    wl = tmp_path / "support"
    shutil.copytree(PROJECT / "examples" / "support", wl)
    (wl / "matrix.yaml").write_text(
        "name: support-replies\nbaseline: current\ngraders: [schema, replylen:ReplyLength]\n"
        "generation:\n  max_tokens: 64\n  warmup: 0\n  structured_output: true\ndivergence: {enabled: false}\n"
        f"variants:\n  - name: current\n    endpoint: {a.base_url}\n  - name: candidate\n    endpoint: {b.base_url}\n",
        encoding="utf-8")
    got = _each_executor(runner, tmp_path, ["run", "--workload", str(wl), "--limit", "4"], "workload")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    first = got["procs1"]
    for ex, ledger in got.items():
        run = next(Database(ledger).query("select * from runs"))
        assert run["workload_dir"] == str(wl), ex
        assert "replylen" in json.dumps(json.loads(run["graders_json"])), ex
        assert _grades(ledger) == _grades(first), ex
        rep = runner.invoke(cli, ["report", "--ledger", str(ledger), "--markdown"])
        assert rep.exit_code == 0, rep.output
        assert "reply words" in rep.output, ex


def test_a_resumed_run_sends_the_same_requests_again_on_every_executor(runner, tmp_path, ray_address):
    firsts = {}
    for ex, flags in EXECUTORS.items():
        with StubServer(StubConfig(ttft_ms=2, itl_ms=0)) as a, \
                StubServer(StubConfig(ttft_ms=2, itl_ms=0, fault="http_500", fault_every=3)) as b:
            m = _matrix(tmp_path, (a, b), "retry: {max_retries: 0}\n")
            ledger = tmp_path / f"resume-{ex}.db"
            r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "6", "--no-grade", "-q", "--ledger",
                                    str(ledger), "--max-error-rate", "1", *flags])
            assert r.exit_code == 0, f"{ex}: {r.output}"
            run_id = next(Database(ledger).query("select id from runs"))["id"]
            b.cfg.fault = None
            r = runner.invoke(cli, ["run", "--resume", run_id, "--retry-failed", "http_5xx", "--no-grade", "-q",
                                    "--ledger", str(ledger), *flags])
            assert r.exit_code == 0, f"{ex}: {r.output}"
        firsts[ex] = Counter((k[0], k[1], k[2]) for k, n in _rows(ledger).items() for _ in range(n)
                             if k[4] and k[5] is None)  # the final, successful rows
    assert all(c == firsts["procs1"] for c in firsts.values()), firsts
    assert sum(firsts["procs1"].values()) == 12  # every request of both variants ends answered


@pytest.mark.parametrize("args, says", [
    (["--time-budget", "5m"], "--time-budget sizes the run from the first variant's probes"),
    (["--interleave"], "on Ray each variant runs as its own task, all at once"),
    (["--order", "alternate"], "on Ray each variant runs as its own task, all at once"),
    (["--order", "blocks"], "on Ray each variant runs as its own task, all at once"),
    (["--grader", "divergence"], "teacher-forced scoring (the divergence grader)"),
])
def test_ray_refuses_what_it_cannot_carry_before_anything_is_written(runner, tmp_path, stubs, args, says):
    a, b = stubs
    m = tmp_path / "m.yaml"
    m.write_text(f"name: r\nbaseline: base\nvariants:\n  - name: base\n    endpoint: {a.base_url}\n"
                 f"  - name: cand\n    endpoint: {b.base_url}\n", encoding="utf-8")
    ledger = tmp_path / "l.db"
    served = a.cfg.counters["requests"]
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "2", "--ledger", str(ledger), "-q", "--ray", *args])
    assert r.exit_code == 2, r.output
    assert says in r.output
    assert len(r.output.strip().splitlines()) == 1  # one line, no traceback
    assert a.cfg.counters["requests"] == served  # nothing sent
    assert not ledger.exists() or Database(ledger)["runs"].count == 0  # nothing written


def test_a_sending_process_that_dies_leaves_its_request_as_a_row_of_its_own_class():
    import asyncio
    import time

    from evalkit.execution.procs import DIED, SenderPool

    with StubServer(StubConfig(ttft_ms=1500, itl_ms=0)) as s:
        async def go():
            pool = SenderPool(2, time.perf_counter(), 30.0, False, lambda proc, windows: None)
            await pool.start()
            payload = {"model": "stub", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                       "stream": True}
            url = f"{s.base_url}/v1/chat/completions"
            sends = [asyncio.ensure_future(pool.send(url, payload, {}, None)) for _ in range(2)]
            await asyncio.sleep(0.5)
            pool.procs[0].kill()  # the first process dies with its request in hand
            got = await asyncio.gather(*sends)
            errors = await pool.close()
            return got, errors

        got, errors = asyncio.run(go())
    classes = sorted(str(r.error_class) for r, _ in got)
    assert classes == sorted([DIED, "None"])
    assert any("died" in e for e in errors)  # and the level says a sending process was lost


# --- every road alternates, or says why not (issue 47) -------------------------------------------------

ROADS = {  # a road's options -> the order it takes by default
    "sequential": (["--limit", "6"], "alternate"),
    "procs2": (["--limit", "6", "--concurrency", "2", "--client-procs", "2"], "alternate"),
    "sweep": (["--limit", "6", "--sweep", "1,2"], "alternate"),
    "rate": (["--limit", "6", "--rate", "50"], "alternate"),
    "trace": (["--trace", str(TRACE), "--trace-format", "mooncake", "--speedup", "8", "--trace-limit", "12"],
              "alternate"),
    "search": (["--limit", "6", "--search", "concurrency", "--max-probes", "3", "--slo", "ttft_p99=5s"], "sequential"),
    "ray": (["--limit", "6", "--ray"], "parallel"),
}


def _order_run(runner, tmp_path: Path, stubs, road: str) -> Path:
    args, _ = ROADS[road]
    ledger = tmp_path / f"order-{road}.db"
    r = runner.invoke(cli, ["run", "--matrix", str(_matrix(tmp_path, stubs)), *args, "--ledger", str(ledger), "-q",
                            "--no-grade"])
    assert r.exit_code == 0, r.output
    return ledger


@pytest.mark.parametrize("road", sorted(ROADS))
def test_every_road_records_the_order_it_took(runner, tmp_path, stubs, ray_address, road):
    load = json.loads(next(Database(_order_run(runner, tmp_path, stubs, road)).query("select load_json from runs"))
                      ["load_json"])
    assert load["order"] == ROADS[road][1]


@pytest.mark.parametrize("road", sorted(r for r, (_, kind) in ROADS.items() if kind == "alternate"))
def test_an_alternating_road_sends_each_variant_in_every_block(runner, tmp_path, stubs, road):
    rows = list(Database(_order_run(runner, tmp_path, stubs, road)).query(
        "select order_block, variant from requests where is_warmup = 0 and final = 1"))
    blocks: dict[int, set[str]] = {}
    for r in rows:
        blocks.setdefault(r["order_block"], set()).add(r["variant"])
    assert all(v == {"base", "cand"} for v in blocks.values()), blocks


@pytest.mark.parametrize("road", sorted(r for r, (_, kind) in ROADS.items() if kind == "alternate"))
def test_an_alternating_road_interleaves_the_variants_in_time(runner, tmp_path, stubs, road):
    seq = [r["variant"] for r in Database(_order_run(runner, tmp_path, stubs, road)).query(
        "select variant from requests where is_warmup = 0 order by mono_start_ms")]
    switches = sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)
    assert switches >= 2, seq  # back to back switches once


@pytest.mark.parametrize("args, says", [
    (["--search", "concurrency", "--order", "alternate"], "a search chooses each variant's probes"),
    (["--ray", "--order", "alternate"], "on Ray each variant runs as its own task"),
    (["--order", "parallel"], "--order parallel is Ray's"),
])
def test_an_order_a_road_cannot_take_is_refused_in_one_line(runner, tmp_path, stubs, args, says):
    ledger = tmp_path / "refused.db"
    r = runner.invoke(cli, ["run", "--matrix", str(_matrix(tmp_path, stubs)), "--limit", "2", *args, "--ledger",
                            str(ledger), "-q"])
    assert r.exit_code == 2, r.output
    assert says in r.output
    assert len(r.output.strip().splitlines()) == 1
