"""Nothing lost, nothing leaked: kill -9 and SIGINT mid-run, resume, servers that fail to start,
retries, a table of bad inputs, planted secrets, and a soak with a known fault rate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.paths import PROJECT_DIR
from evalkit.testing.stub_server import StubConfig, StubServer

from .ledger_integrity import not_a_ledger

CLI = [sys.executable, str(PROJECT_DIR / "cli.py")]


def _wait_rows(ledger: Path, n: int, timeout: float = 30) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ledger.exists():
            try:
                if Database(ledger)["requests"].count >= n:
                    return
            except Exception:  # the writer may be mid-migration; try again
                pass
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} rows after {timeout} s")


def _measured_keys(db: Database) -> list[tuple]:
    return [(r["variant"], r["case_id"], r["repeat"]) for r in
            db.query("select variant, case_id, repeat from requests where is_warmup = 0 and final = 1")]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_mid_run_then_resume_completes_exactly_the_missing(sig, stub_pair, endpoint_matrix, ledger_path):
    a, b = stub_pair
    a.cfg.ttft_ms = b.cfg.ttft_ms = 40
    m = endpoint_matrix(a.base_url, b.base_url)
    p = subprocess.Popen([*CLI, "run", "--matrix", str(m), "--limit", "20", "--ledger", str(ledger_path), "-q",
                          "--no-grade"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_rows(ledger_path, 10)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=30)
    assert p.returncode != 0
    db = Database(ledger_path)
    run = next(db["runs"].rows)
    before = _measured_keys(db)
    assert 0 < len(before) < 40
    assert len(before) == len(set(before))
    if sig == signal.SIGINT:
        assert "Traceback" not in out
        assert run["status"] == "interrupted"  # marked on the way out
    r = subprocess.run([*CLI, "run", "--resume", run["id"], "--ledger", str(ledger_path), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(before)} already in the ledger (skipped)" in r.stdout
    after = _measured_keys(db)
    assert len(after) == 40
    assert len(set(after)) == 40  # no gaps, no duplicates
    assert db["runs"].get(run["id"])["status"] == "complete"
    assert db.execute("pragma integrity_check").fetchone()[0] == "ok"


@pytest.mark.integration
def test_launched_server_dies_with_evalkit_even_on_kill_9(tmp_path: Path):
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\nexec sleep 300\n")
    fake.chmod(0o755)
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys, time\nfrom pathlib import Path\nfrom evalkit.engines.vllm_server import VLLMServer\n"
        f"s = VLLMServer('m', 'm', [], Path({str(tmp_path / 'log')!r}), python={str(fake)!r})\n"
        "s.start(); print(s.proc.pid, flush=True); time.sleep(300)\n")
    p = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True, cwd=PROJECT_DIR)
    child = int(p.stdout.readline())
    os.kill(child, 0)  # running
    p.kill()
    p.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the server outlived evalkit")


def test_server_that_fails_to_start_is_reported_and_others_still_run(runner, stub, write, ledger_path, monkeypatch,
                                                                     tmp_path):
    fake = tmp_path / "fake-vllm"
    fake.write_text("#!/bin/sh\necho 'loading model...'\necho 'ValueError: no such model: /nope' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EVALKIT_VLLM_PYTHON", str(fake))
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    m = write("m.yaml", f"name: x\nbaseline: ok\ngeneration: {{baseline_repeats: 1}}\nvariants:\n"
                        f"  - name: ok\n    endpoint: {stub.base_url}\n  - name: broken\n    model: nobody/nope\n")
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(m), "--limit", "2", "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: variant(s) failed: broken")
    assert "exited with code 3" in last
    db = Database(ledger_path)
    v = {x["name"]: x for x in db["variants"].rows}
    assert v["ok"]["status"] == "complete"
    assert v["broken"]["status"] == "failed"
    assert "ValueError: no such model" in v["broken"]["log_tail"]
    assert db["requests"].count == 5  # the healthy variant ran (1 warmup + 2 timing probes + 2)


def _run_faulty_stub(runner, endpoint_matrix, ledger_path, fault: str, limit: int, extra: str = ""):
    """One stub that fails every 2nd request with `fault`; run `limit` cases against it, no warm-up."""
    with StubServer(StubConfig(fault=fault, fault_every=2, ttft_ms=1, itl_ms=0)) as s:
        m = endpoint_matrix(s.base_url, warmup=0, extra=extra)
        return runner.invoke(cli, ["run", "--matrix", str(m), "--limit", str(limit), "--ledger", str(ledger_path),
                                   "-q", "--no-grade"])


@pytest.mark.integration
def test_retry_policy_adds_rows_per_attempt(runner, endpoint_matrix, ledger_path):
    r = _run_faulty_stub(runner, endpoint_matrix, ledger_path, "http_503", 4,
                         "retry:\n  max_retries: 2\n  backoff_s: 0\n")
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    finals = list(db["requests"].rows_where("final = 1"))
    retried = list(db["requests"].rows_where("final = 0"))
    assert len(finals) == 4
    assert all(f["error_class"] is None for f in finals)  # every 503 was retried
    # the stub fails every 2nd request it sees: items 2-4 each fail once, then succeed on retry
    assert len(retried) == 3
    assert all(x["error_class"] == "http_503" for x in retried)


@pytest.mark.integration
def test_retries_are_off_by_default(runner, endpoint_matrix, ledger_path):
    r = _run_faulty_stub(runner, endpoint_matrix, ledger_path, "http_429", 4)
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    assert db["requests"].count == 4
    assert db["requests"].count_where("error_class = 'http_429'") == 2


GOOD_MATRIX = "name: t\nbaseline: a\nvariants:\n  - name: a\n    model: m\n"


def _bad_inputs(tmp: Path, shipped_row: dict) -> list[tuple[str, list[str]]]:
    def w(name: str, text: str) -> str:
        (tmp / name).write_text(text)
        return str(tmp / name)

    row = json.dumps(shipped_row)
    newer = tmp / "newer.db"
    from evalkit.ledger import open_ledger

    open_ledger(newer).close()
    Database(newer)["_sqlite_migrations"].insert({"migration_set": "evalkit", "name": "m999_x", "applied_at": "x"})
    not_a_ledger(tmp / "plain.db").write_text("not a database " * 100)
    rub = tmp / "rub"
    (rub / "schemas").mkdir(parents=True, exist_ok=True)
    (rub / "formality.yaml").write_text((PROJECT_DIR / "rubrics" / "formality.yaml").read_text())
    return [
        ("dataset: not JSON", ["dataset", "validate", w("d1.jsonl", row + "\n{oops\n")]),
        ("dataset: missing field", ["dataset", "validate", w("d2.jsonl", json.dumps(
            {k: v for k, v in shipped_row.items() if k != "messages"}) + "\n")]),
        ("dataset: unknown schema", ["dataset", "validate", w("d3.jsonl", json.dumps({**shipped_row, "schema": "x"}))]),
        ("dataset: formality 6", ["dataset", "validate", w("d4.jsonl", json.dumps({**shipped_row, "formality": 6}))]),
        ("dataset: duplicate id", ["dataset", "validate", w("d5.jsonl", row + "\n" + row + "\n")]),
        ("matrix: unknown key", ["matrix", "validate", w("m1.yaml", GOOD_MATRIX + "extra: 1\n")]),
        ("matrix: unknown engine", ["matrix", "validate", w("m2.yaml", GOOD_MATRIX + "    engine: tgi\n")]),
        ("matrix: no baseline", ["matrix", "validate", w("m3.yaml", GOOD_MATRIX.replace("baseline: a\n", ""))]),
        ("matrix: duplicate variant", ["matrix", "validate", w("m4.yaml", GOOD_MATRIX + "  - name: a\n    model: m\n")]),
        ("matrix: bad URL", ["matrix", "validate", w("m5.yaml", GOOD_MATRIX.replace("model: m", "endpoint: localhost"))]),
        ("rubric: unknown rule", ["rubrics", "validate", "--dir", str(rub)], ),
        ("rubric: bad regex", ["rubrics", "validate", "--dir", str(rub)]),
        ("rubric: weights do not parse", ["rubrics", "validate", "--dir", str(rub)]),
        ("CLI: conflicting flags", ["run", "--mode", "sequential", "--rate", "2"]),
        ("CLI: negative rate", ["run", "--rate", "-3"]),
        ("CLI: bad limit", ["run", "--limit", "-1"]),
        ("CLI: unknown option", ["report", "--colour"]),
        ("ledger: not an evalkit ledger", ["report", "--ledger", str(tmp / "plain.db")]),
        ("ledger: newer schema", ["report", "--ledger", str(newer)]),
    ]


RUBRIC_BODIES = {
    "rubric: unknown rule": "version: 1\nrules:\n  mentions_ceo: {}\n",
    "rubric: bad regex": "version: 1\nrules:\n  salutation:\n    pattern: '[a-'\n",
    "rubric: weights do not parse": "version: 1\nrules:\n  mentions_company:\n    weight: heavy\n",
}


@pytest.mark.integration
def test_bad_inputs_table_one_line_exit_2_nothing_written(runner, tmp_path: Path, shipped_rows):
    cases = _bad_inputs(tmp_path, shipped_rows[0])
    assert len(cases) >= 15
    for name, args in cases:
        if name in RUBRIC_BODIES:
            (tmp_path / "rub" / "persona.yaml").write_text(RUBRIC_BODIES[name])
        ledger = tmp_path / f"fresh-{abs(hash(name))}.db"
        extra = ["--ledger", str(ledger)] if args[0] == "run" else []
        r = runner.invoke(cli, [*args, *extra])
        lines = [x for x in r.output.strip().splitlines() if x.strip()]
        assert r.exit_code == 2, (name, r.output)
        assert len(lines) == 1, (name, r.output)
        assert lines[0].startswith("Error: "), (name, r.output)
        assert "Traceback" not in r.output
        assert not ledger.exists(), name  # nothing half written


@pytest.mark.integration
def test_planted_secret_reaches_no_output(runner, write, tmp_path, monkeypatch):
    secret = "sk-evalkit-PLANTED-0123456789abcdef"
    monkeypatch.setenv("EVALKIT_TEST_API_KEY", secret)
    ledger = tmp_path / "l.db"
    with StubServer(StubConfig(ttft_ms=1, itl_ms=0)) as ok, \
            StubServer(StubConfig(fault="echo_auth", ttft_ms=1, itl_ms=0)) as leaky:
        m = write("m.yaml", f"name: s\nbaseline: a\ngeneration: {{baseline_repeats: 1}}\nvariants:\n"
                            f"  - name: a\n    endpoint: {ok.base_url}\n    api_key_env: EVALKIT_TEST_API_KEY\n"
                            f"  - name: b\n    endpoint: {leaky.base_url}\n    api_key_env: EVALKIT_TEST_API_KEY\n")
        r1 = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "3", "--ledger", str(ledger)])
    # every request of the leaky variant failed: it is `failed`, the run exits 1, and no line carries the key
    assert r1.exit_code == 1, r1.output
    assert "variant(s) failed: b (3 of 3 requests failed" in r1.output, r1.output
    db = Database(ledger)
    assert db["requests"].count_where("error_class = 'http_401' and is_warmup = 0") == 3  # the leaky server answered
    outputs = [r1.output]
    for args in (["report"], ["report", "--json"], ["report", "--markdown"],
                 ["report", "--html", str(tmp_path / "r.html")], ["publish", "--out", str(tmp_path / "pub")]):
        outputs.append(runner.invoke(cli, [*args, "--ledger", str(ledger)]).output)
    assert (tmp_path / "r.html").exists()
    assert (tmp_path / "pub" / "requests").exists()
    db.execute("pragma wal_checkpoint(TRUNCATE)")
    blobs = [ledger.read_bytes().decode("latin-1")] + outputs
    # every file written: HTML report, parquet, dataset card (binary files are read as bytes)
    blobs += [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".db"]
    assert not [b for b in blobs if secret in b]
    assert any("[REDACTED]" in (x["error"] or "") for x in db["requests"].rows)


@pytest.mark.integration
def test_soak_2000_requests_concurrency_64_with_known_fault_rate(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(fault="http_500", fault_every=10, ttft_ms=2, itl_ms=0, chars_per_chunk=64)) as s:
        m = endpoint_matrix(s.base_url, warmup=0, extra="telemetry:\n  scrape: false\n")
        t0 = time.monotonic()
        r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "100", "--repeats", "20", "--concurrency", "64",
                                "--ledger", str(ledger_path), "-q", "--no-grade"])
        wall = time.monotonic() - t0
        sent, injected = s.cfg.counters["requests"], s.cfg.counters["faults"]
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    assert sent == 2000
    assert injected == 200
    assert db["requests"].count == sent  # every request is a row
    assert db["requests"].count_where("error_class is not null") == injected
    assert db["requests"].count_where("error_class = 'http_500'") == injected
    keys = _measured_keys(db)
    assert len(set(keys)) == 2000
    print(f"soak: {sent} requests, {injected} faults, {wall:.1f} s wall")


@pytest.mark.integration
def test_server_dies_mid_run_every_request_still_a_row(tmp_path, endpoint_matrix):
    import socket as _s

    with _s.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    stub = subprocess.Popen([sys.executable, "-m", "evalkit.testing.stub_server", "--port", str(port), "--ttft-ms", "60"],
                            cwd=PROJECT_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = tmp_path / "l.db"
    try:
        deadline = time.monotonic() + 30  # a cold interpreter on a busy machine takes a while to listen
        while True:
            try:
                with _s.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the stub server never listened"
                time.sleep(0.05)
        m = endpoint_matrix(f"http://127.0.0.1:{port}", warmup=0, extra="telemetry:\n  scrape: false\n")
        run = subprocess.Popen([*CLI, "run", "--matrix", str(m), "--limit", "12", "--ledger", str(ledger), "-q",
                                "--no-grade", "--max-error-rate", "0.1"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        _wait_rows(ledger, 4)
        stub.kill()  # the server dies mid-run
        out, _ = run.communicate(timeout=60)
    finally:
        stub.kill()
    # an endpoint that dies: every planned request is still a row, and the variant is `failed`
    assert run.returncode == 1, out
    assert "variant(s) failed: base" in out, out
    assert "> --max-error-rate 10%" in out, out
    db = Database(ledger)
    assert db["requests"].count == 12  # every planned request is a row
    errs = [r["error_class"] for r in db["requests"].rows_where("error_class is not null")]
    assert errs
    assert set(errs) <= {"connect_error", "stream_cut"}
    assert "errors" in out
    assert str(len(errs)) in out


@pytest.mark.integration
def test_reply_that_is_not_json_fails_the_schema_grade(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(fault="not_json", ttft_ms=1, itl_ms=0)) as s:
        r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(s.base_url, warmup=0)), "--limit", "2",
                                "--ledger", str(ledger_path), "-q"])
    assert r.exit_code == 0, r.output
    db = Database(ledger_path)
    assert db["requests"].count_where("error_class is null") == 2  # the request itself succeeded
    g = list(db["grades"].rows_where("grader = 'schema'"))
    assert len(g) == 2
    assert all(x["passed"] == 0 and x["explanation"].startswith("not valid JSON") for x in g)


@pytest.mark.integration
def test_token_counts_fall_back_and_say_so(runner, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(usage=False, ttft_ms=1, itl_ms=0)) as s:
        runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(s.base_url, warmup=0)), "--limit", "2",
                            "--ledger", str(ledger_path), "-q", "--no-grade"])
    rows = list(Database(ledger_path)["requests"].rows)
    assert len(rows) == 2
    for r in rows:
        assert r["usage_source"] == "chunk_count"  # flagged: not the server's own count
        assert r["completion_tokens"] == len(json.loads(r["chunk_offsets_ms_json"])) > 0


@pytest.mark.integration
def test_tokenizer_fallback_for_local_models(tmp_path):
    from evalkit.engines.bundled import resolve_model
    from evalkit.measure.client import RequestResult
    from evalkit.measure.tokens import fill_token_counts

    model = resolve_model("bundled:smollm2-135m-instruct")  # prepared once per cache (~30 s), then reused
    r = RequestResult(started_at="t", text="Hello there, Priya!", chunk_offsets_ms=[1.0, 2.0])
    fill_token_counts(r, [{"role": "user", "content": "Say hello."}], model)
    assert r.usage_source == "tokenizer"
    assert 3 <= r.completion_tokens <= 8
    assert r.prompt_tokens > 5


@pytest.mark.integration
def test_retry_honours_retry_after(runner, endpoint_matrix, ledger_path):
    from datetime import datetime

    # every 2nd request gets 429 with Retry-After: 1; the retry must wait that second, not backoff_s
    r = _run_faulty_stub(runner, endpoint_matrix, ledger_path, "http_429", 2,
                         "retry:\n  max_retries: 1\n  backoff_s: 0\n  on_errors: [http_429]\n")
    assert r.exit_code == 0, r.output
    rows = list(Database(ledger_path).query("select started_at, e2e_ms, error_class, final from requests order by seq"))
    assert [x["error_class"] for x in rows] == [None, "http_429", None]
    t = [datetime.fromisoformat(x["started_at"]) for x in rows]
    waited = (t[2] - t[1]).total_seconds() - rows[1]["e2e_ms"] / 1000
    assert waited >= 0.95, waited  # Retry-After: 1
    assert rows[1]["final"] == 0
    assert rows[2]["final"] == 1


# --- why a launched server died (issue 46) ------------------------------------------------------------------

SIGTERMED = ("INFO 05-02 10:00:00 [core.py:71] EngineCore started\n"
             "(EngineCore_DP0 pid=42) INFO 05-02 10:00:09 [core.py:88] EngineCore: trigger received signal=SIGTERM\n"
             "{last} 05-02 10:00:09 [__init__.py:9] Triton is installed, but doesn't include CPU backend\n")
TRACEBACK = ("INFO loading\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
             "    raise RuntimeError('boom')\nRuntimeError: CUDA error: out of memory\n"
             "WARNING 05-02 [x.py:1] shutting down with 1 warning\n")


@pytest.mark.parametrize(("log", "code", "line"), [
    (SIGTERMED.format(last="INFO"), -15, "signal=SIGTERM"),
    (SIGTERMED.format(last="WARNING"), -15, "signal=SIGTERM"),
    (SIGTERMED.format(last="WARNING"), 1, "signal=SIGTERM"),
    (TRACEBACK, 1, "RuntimeError: CUDA error: out of memory"),
    ("(EngineCore_DP0 pid=7) Traceback (most recent call last):\n(EngineCore_DP0 pid=7)   File \"a.py\"\n"
     "(EngineCore_DP0 pid=7) ValueError: no such model\nINFO stopping\n", 1, "ValueError: no such model"),
    ("INFO loading weights\nKilled\nWARNING 05-02 [x.py:1] leaked semaphore\n", 137, "Killed"),
    ("usage: api_server [-h]\napi_server: error: unrecognized arguments: --nope\n", 2, "error: unrecognized arguments"),
    ("ERROR 05-02 [engine.py:3] EngineCore failed to start\nWARNING 05-02 [x.py:1] RuntimeWarning: leak\n", 1,
     "EngineCore failed to start"),
    ("INFO loading\nWARNING 05-02 [x.py:1] Triton is installed, but doesn't include CPU backend\n", -9,
     "Triton is installed"),  # nothing fatal: the last line is all there is
])
def test_the_log_line_that_says_why_a_server_ended(log, code, line):
    from evalkit.engines.vllm_server import telling_line

    assert line in (telling_line(log, code) or "")


@pytest.mark.parametrize(("log", "code"), [(SIGTERMED.format(last="WARNING"), -15), (TRACEBACK, 1)])
def test_a_warning_is_never_the_cause_while_a_fatal_line_exists(log, code):
    from evalkit.engines.vllm_server import telling_line

    assert "WARNING" not in (telling_line(log, code) or "")


@pytest.mark.parametrize(("code", "says"), [
    (-15, "was killed by SIGTERM (exit code -15)"),
    (1, "exited with code 1"),
    (137, "exited with code 137 (128 + 9: killed by SIGKILL, often the out-of-memory killer)"),
])
def test_how_a_server_ended_names_the_signal_or_code(code, says, tmp_path):
    from evalkit.engines.vllm_server import death_cause

    log = tmp_path / "server.log"
    log.write_text(SIGTERMED.format(last="WARNING"))
    assert death_cause(code, log).startswith(f"{says}; its log says: ")


def test_a_sigterm_death_is_blamed_on_the_signal_line(tmp_path):
    from evalkit.engines.vllm_server import death_cause

    log = tmp_path / "server.log"
    log.write_text(SIGTERMED.format(last="INFO"))
    assert death_cause(-15, log).endswith("EngineCore: trigger received signal=SIGTERM")
