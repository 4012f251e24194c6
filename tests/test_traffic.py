"""Traffic like production: trace replay in four formats (arrivals at the recorded offsets, exact
prompt and output lengths, shared prefixes), conversations (each turn's history holds the
variant's own replies, graded per turn), and other load tools' results imported beside evalkit's."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.paths import PROJECT_DIR
from evalkit.spec.traces import load_trace
from evalkit.testing.stub_server import StubConfig, StubServer

TRACES = PROJECT_DIR / "data" / "traces"
FIXTURES = Path(__file__).parent / "fixtures"
CONVERSATIONS = PROJECT_DIR / "data" / "resume_gen_conversations.jsonl"


def quant_env_ready() -> bool:
    from evalkit.engines.bundled import quant_python
    from evalkit.errors import EngineError

    try:
        quant_python()
        return True
    except EngineError:
        return False


# the bundled tokenizer is prepared by a subprocess the first time (quant-env), so these are integration tests
def needs_tokenizer(test):
    skip = pytest.mark.skipif(not quant_env_ready(), reason="the bundled tokenizer needs `make quant-env`")
    return pytest.mark.integration(skip(test))


@pytest.mark.parametrize("name, fmt, rows", [("mooncake_sample.jsonl", "mooncake", 40), ("azure_sample.csv", "azure", 40),
                                              ("burstgpt_sample.csv", "burstgpt", 40),
                                              ("evalkit_sample.jsonl", "evalkit", 12)])
def test_the_shipped_sample_traces_load(name, fmt, rows):
    got = load_trace(TRACES / name, fmt)
    assert len(got) == rows
    assert got[0].offset_s == 0
    assert all(b.offset_s >= a.offset_s for a, b in zip(got, got[1:], strict=False))


@pytest.mark.integration
def test_the_samples_are_current():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(PROJECT_DIR / "data" / "build_traces.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(PROJECT_DIR / "data" / "build_dataset.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("fmt, text, message", [
    ("mooncake", '{"input_length": 10, "output_length": 5}\n', "line 1" if False else ":1: field 'timestamp': missing"),
    ("mooncake", '{"timestamp": 100, "input_length": 10, "output_length": 5}\n{"timestamp": 50, "input_length": 10, '
                 '"output_length": 5}\n', ":2: arrival 0.05 s comes before"),
    ("mooncake", '{"timestamp": -5, "input_length": 10, "output_length": 5}\n', "first arrival is negative"),
    ("mooncake", '{"timestamp": 0, "input_length": "lots", "output_length": 5}\n', "field 'input_length': not a number"),
    ("azure", "TIMESTAMP,ContextTokens\n2024-01-01 00:00:00,5\n", "missing column(s) GeneratedTokens"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", ":2: field 'TIMESTAMP'"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n,ChatGPT,5,5\n", ":2: field 'Timestamp': missing"),
    ("evalkit", '{"offset_s": 0, "messages": [{"role": "user", "content": ""}]}\n', "field 'messages'"),
    ("evalkit", '{"messages": [{"role": "user", "content": "hi"}]}\n', "field 'offset_s': missing"),
])
def test_bad_traces_are_one_line_with_file_and_line_exit_2(runner, endpoint_matrix, stub, write, tmp_path, fmt, text,
                                                           message):
    trace = write(f"t.{'csv' if fmt in ('azure', 'burstgpt') else 'jsonl'}", text)
    ledger = tmp_path / "l.db"
    r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(stub.base_url)), "--trace", str(trace),
                            "--trace-format", fmt, "--ledger", str(ledger), "-q"])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert str(trace) in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not ledger.exists()


def test_unknown_format_and_wrong_tool_files_are_usage_errors(runner, endpoint_matrix, stub, tmp_path):
    r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(stub.base_url)), "--trace",
                            str(TRACES / "mooncake_sample.jsonl"), "--trace-format", "sharegpt", "-q"])
    assert r.exit_code == 2
    assert "--trace-format" in r.output
    r = runner.invoke(cli, ["import", "aiperf", str(FIXTURES / "guidellm_0.8.1_stub.json"), "--ledger",
                            str(tmp_path / "l.db")])
    assert r.exit_code == 2
    assert "not an AIPerf profile_export.jsonl record" in r.output


@needs_tokenizer
def test_prompts_are_exactly_the_recorded_length_by_the_tokenizer():
    from evalkit.execution.traces import TraceSpec, _count, trace_cases
    from evalkit.spec.matrix import load_matrix

    cases, offsets, label = trace_cases(TraceSpec(str(TRACES / "azure_sample.csv"), "azure", 1.0, 8),
                                        load_matrix("default"))
    from evalkit.execution.traces import tokenizer_for

    tok, _ = tokenizer_for(load_matrix("default"))
    rows = load_trace(TRACES / "azure_sample.csv", "azure", 8)
    assert "tokenizer" in label
    assert len(cases) == 8
    for c, r in zip(cases, rows, strict=True):
        assert _count(tok, c.messages[0].content) == r.input_tokens  # chat template included
        assert c.max_tokens == r.output_tokens
        assert c.attributes["task"] == "trace"


@pytest.mark.integration
@needs_tokenizer
def test_replay_sends_every_row_once_at_its_offset_with_its_lengths_and_shared_prefixes(runner, endpoint_matrix,
                                                                                        tmp_path):
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0, prefix_cache=True)) as s:
        ledger = tmp_path / "t.db"
        r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(s.base_url, warmup=0)), "--trace",
                                str(TRACES / "mooncake_sample.jsonl"), "--trace-format", "mooncake", "--speedup", "4",
                                "--trace-limit", "24", "--ledger", str(ledger), "-q"])
        assert r.exit_code == 0, r.output
    db = Database(ledger)
    rows = list(db.query("select * from requests where is_warmup = 0 order by trace_row"))
    assert [x["trace_row"] for x in rows] == list(range(1, 25))  # every row, once, in trace order
    recorded = [x.offset_s * 1000 / 4 for x in load_trace(TRACES / "mooncake_sample.jsonl", "mooncake", 24)]
    sent = [x["sent_ms"] - rows[0]["sent_ms"] for x in rows]
    gaps_rec = [b - a for a, b in zip(recorded, recorded[1:], strict=False)]
    gaps_got = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert statistics.fmean(gaps_got) == pytest.approx(statistics.fmean(gaps_rec), rel=0.05)
    assert all(x["completion_tokens"] == x["trace_output_tokens"] for x in rows)  # max_tokens + ignore_eos held
    assert all(json.loads(x["request_json"])["ignore_eos"] for x in rows)
    shared = [x for x in rows if x["designed_shared_tokens"]]
    assert shared
    assert all(x["cached_prompt_tokens"] > 0 for x in shared)  # the shared hash blocks hit the cache
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger), "--json"]).output)
    t = rep["findings"]["trace_fidelity"][0]
    assert t["rows"] == 24
    assert abs(t["mean_gap_error_pct"]) < 5
    assert t["output_exact_pct"] == 100
    p = rep["findings"]["prefix_sharing"][0]
    assert p["designed_shared_pct"] > 0
    assert p["cached_pct"] > 0
    assert p["server_hit_pct"] > 0
    assert any(n.startswith("trace base:") for n in rep["findings"]["notes"])
    assert db["grades"].count == 0  # synthetic prompts: timing only, nothing to grade


@pytest.mark.integration
def test_an_evalkit_request_log_replays_its_messages(runner, endpoint_matrix, tmp_path):
    with StubServer(StubConfig(ttft_ms=2, itl_ms=0, keep_bodies=True)) as s:
        ledger = tmp_path / "e.db"
        r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(s.base_url, warmup=0)), "--trace",
                                str(TRACES / "evalkit_sample.jsonl"), "--trace-format", "evalkit", "--speedup", "8",
                                "--ledger", str(ledger), "-q", "--no-grade"])
        assert r.exit_code == 0, r.output
        bodies = list(s.cfg.bodies)
    logged = [json.loads(x) for x in (TRACES / "evalkit_sample.jsonl").read_text().splitlines()]
    assert [b["messages"] for b in bodies] == [x["messages"] for x in logged]
    assert {x["case_id"] for x in Database(ledger)["requests"].rows} == {x["id"] for x in logged}


@pytest.mark.integration
def test_conversations_send_each_turn_with_the_variants_own_replies_and_grade_each_turn(runner, endpoint_matrix,
                                                                                         tmp_path):
    with StubServer(StubConfig(model="a", ttft_ms=1, itl_ms=0, keep_bodies=True, numbered=True)) as a, \
            StubServer(StubConfig(model="b", ttft_ms=1, itl_ms=0, keep_bodies=True, numbered=True)) as b:
        m = endpoint_matrix(a.base_url, b.base_url, warmup=0)
        ledger = tmp_path / "c.db"
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--dataset", str(CONVERSATIONS), "--limit", "3",
                                "--ledger", str(ledger), "-q"])
        assert r.exit_code == 0, r.output
        bodies = {"base": list(a.cfg.bodies), "cand": list(b.cfg.bodies)}
    db = Database(ledger)
    rows = list(db.query("select * from requests where is_warmup = 0 order by seq"))
    assert len(rows) == 2 * 3 * 3  # two variants x three conversations x three turns
    for v in ("base", "cand"):
        mine = [x for x in rows if x["variant"] == v]
        by_conv: dict[str, list[dict]] = {}
        for x in mine:
            by_conv.setdefault(x["conversation_id"], []).append(x)
        for conv, turns in by_conv.items():
            assert [t["turn"] for t in turns] == [0, 1, 2]
            assert [t["case_id"] for t in turns] == [conv, f"{conv}#t1", f"{conv}#t2"]
        # each later request's history holds this variant's own earlier replies, in order
        row_of = {x["text"]: x for x in mine}  # numbered replies: each text is one row's
        assert len(row_of) == len(mine)
        assert len(bodies[v]) == len(mine)
        histories = 0
        for body in bodies[v]:
            replies = [row_of[m["content"]] for m in body["messages"] if m["role"] == "assistant"]
            assert [x["turn"] for x in replies] == list(range(len(replies)))
            assert len({x["conversation_id"] for x in replies}) <= 1
            histories += bool(replies)
        assert histories == 6  # turns 1 and 2 of three conversations
    cases = {c["id"]: c for c in load_dataset_rows()}
    formality = {g["request_id"]: json.loads(g["detail_json"]) for g in db["grades"].rows_where("grader = 'formality'")}
    for x in rows:
        conv = cases[x["conversation_id"]]
        want = conv["formality"] if x["turn"] == 0 else (conv["turns"][x["turn"] - 1].get("formality") or conv["formality"])
        assert formality[x["id"]]["requested"] == want  # graded against the level that turn asked for
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger), "--json"]).output)
    c = {x["variant"]: x for x in rep["findings"]["conversations"]}
    assert c["base"]["conversations"] == 3
    assert c["base"]["completed"] == 3
    assert c["base"]["turns"] == 9


def load_dataset_rows() -> list[dict]:
    return [json.loads(x) for x in CONVERSATIONS.read_text().splitlines()]


@pytest.mark.integration
def test_a_turn_without_content_is_a_dataset_error(runner, write):
    row = load_dataset_rows()[0]
    row["turns"][0]["content"] = ""
    p = write("c.jsonl", json.dumps(row) + "\n")
    r = runner.invoke(cli, ["dataset", "validate", str(p)])
    assert r.exit_code == 2
    assert f"{p}:1: field 'turns.0.content'" in r.output


def test_three_tools_results_import_and_sit_beside_evalkits_own(runner, stub_ledger):
    run = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--json"]).output)["run"]["id"]
    for tool, name in (("guidellm", "guidellm_0.8.1_stub.json"), ("aiperf", "aiperf_0.13.0_stub_profile_export.jsonl"),
                       ("vllm-bench", "vllm_bench_serve_0.32_stub.json")):
        r = runner.invoke(cli, ["import", tool, str(FIXTURES / name), "--into", run, "--as", tool, "--ledger",
                                str(stub_ledger)])
        assert r.exit_code == 0, r.output
        assert f"into run {run}" in r.output, r.output
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--json"]).output)
    all_rows = {x["variant"]: x for x in rep["rows"] if x["complexity"] == "all"}
    assert {"base", "cand", "guidellm", "aiperf", "vllm-bench"} <= set(all_rows)
    assert all_rows["guidellm"]["n"] == 6
    assert all_rows["guidellm"]["ttft_p50_ms"] > 0
    assert all_rows["aiperf"]["tpot_p50_ms"] > 0  # AIPerf's "ITL" is evalkit's TPOT
    assert all_rows["vllm-bench"]["ttft_p50_ms"] is None  # openai-chat TTFT is the first chunk of any kind
    db = Database(stub_ledger)
    vb = list(db.query("select * from requests where variant = 'vllm-bench'"))
    assert all(x["first_chunk_ms"] > 0 and x["ttft_ms"] is None and x["timestamp_source"] == "imported" for x in vb)
    assert {v["engine"] for v in db["variants"].rows if v["name"] in ("guidellm", "aiperf", "vllm-bench")} == \
        {"import:guidellm", "import:aiperf", "import:vllm-bench"}
    # a file on its own becomes a run of its own, marked with its source
    r = runner.invoke(cli, ["import", "aiperf", str(FIXTURES / "aiperf_0.13.0_stub_profile_export.jsonl"), "--ledger",
                            str(stub_ledger)])
    assert r.exit_code == 0
    latest = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--json"]).output)
    assert latest["run"]["source"] == "aiperf"
    assert latest["host"] is None
