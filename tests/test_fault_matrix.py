"""The fault matrix (docs/failures.md), one test per row: a launched server that dies, sending
failed requests again, SIGTERM and SIGHUP mid-run, a full disk, Datasette stopped by a signal.
Each ends with a truthful status and exit code, no process left behind, and a resume that
completes the run with one final row per request."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.ledger import copy_ledger
from evalkit.testing.fake_vllm import ENGINE_MARK
from evalkit.testing.stub_server import StubConfig, StubServer

from .test_capacity import fake_checkpoint
from .test_faults import CLI, _wait_rows


def engine_children() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if ENGINE_MARK in line and "ps -eo" not in line]


def finals(db: Database) -> list[tuple]:
    return [(r["variant"], r["case_id"], r["repeat"]) for r in
            db.query("select variant, case_id, repeat from requests where is_warmup = 0 and final = 1")]


@pytest.fixture
def launched(tmp_path: Path, write, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A matrix of two launched variants served by the fake vLLM (real process groups)."""
    monkeypatch.setenv("EVALKIT_VLLM_MODULE", "evalkit.testing.fake_vllm")
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    model = fake_checkpoint(tmp_path / "model", False)
    return write("m.yaml", f"""name: launched
baseline: a
generation: {{baseline_repeats: 1, warmup: 0, structured_output: false, max_tokens: 8}}
variants:
  - name: a
    model: {model}
  - name: b
    model: {model}
""")


@pytest.mark.integration
def test_a_launched_server_that_dies_fails_its_variant_leaves_no_process_and_retry_completes(
        runner, launched, tmp_path, monkeypatch):
    ledger = tmp_path / "l.db"
    before = set(engine_children())
    monkeypatch.setenv("EVALKIT_FAKE_EXIT_AFTER", "3")  # each API server exits (code 3) after 3 requests
    r = runner.invoke(cli, ["run", "--no-grade", "--matrix", str(launched), "--limit", "6", "--ledger", str(ledger), "-q"])
    assert r.exit_code == 1, r.output
    assert "variant(s) failed: a" in r.output
    assert "exited with code 3" in r.output
    db = Database(ledger)
    run = next(db["runs"].rows)
    assert run["status"] == "failed"
    v = {x["name"]: x for x in db["variants"].rows}
    assert v["a"]["status"] == "failed"
    assert v["a"]["exit_code"] == 3
    assert "exited with code 3" in v["a"]["error"]
    assert "fake vLLM" in v["a"]["log_tail"]
    rows = list(db.query("select * from requests where is_warmup = 0 and variant = 'a' order by seq"))
    assert len(rows) == 6  # every planned request is a row: answered, cut, or never sent
    assert sum(x["error_class"] is None for x in rows) == 3
    assert {x["error_class"] for x in rows if x["error_class"]} <= {"not_sent", "connect_error", "stream_cut"}
    assert set(engine_children()) == before  # the dead server's engine child was stopped with its group
    monkeypatch.delenv("EVALKIT_FAKE_EXIT_AFTER")
    r = runner.invoke(cli, ["run", "--resume", run["id"], "--retry-failed", "--ledger", str(ledger), "-q"])
    assert r.exit_code == 0, r.output
    assert "failed requests will be sent again" in r.output
    after = finals(db)
    assert len(after) == 12
    assert len(set(after)) == 12  # one final row per request
    assert all(x["error_class"] is None for x in db.query("select * from requests where final = 1 and is_warmup = 0"))
    old = list(db.query("select * from requests where final = 0 and is_warmup = 0"))
    assert old
    assert all(x["error_class"] for x in old)  # the failed attempts are kept, not final
    assert {x["attempt"] for x in db.query("select attempt from requests where final = 1 and variant = 'a' "
                                           "and error_class is null and seq > ?", [max(x["seq"] for x in rows)])} == {1}
    assert db["runs"].get(run["id"])["status"] == "complete"
    assert set(engine_children()) == before


@pytest.mark.integration
def test_resume_starts_only_the_variants_with_something_to_send(runner, launched, tmp_path, monkeypatch):
    ledger = tmp_path / "l.db"
    monkeypatch.setenv("EVALKIT_FAKE_EXIT_AFTER", "2")
    r = runner.invoke(cli, ["run", "--matrix", str(launched), "--limit", "4", "--ledger", str(ledger), "-q",
                            "--no-grade"])
    assert r.exit_code == 1
    db = Database(ledger)
    run = next(db["runs"].rows)
    monkeypatch.delenv("EVALKIT_FAKE_EXIT_AFTER")
    # mark b as done (it failed the same way); then only a is resumed, b's server is not started
    r = runner.invoke(cli, ["run", "--resume", run["id"], "--retry-failed", "--ledger", str(ledger), "--no-grade"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["run", "--resume", run["id"], "--ledger", str(ledger), "--no-grade"])
    assert r.exit_code == 0
    assert "'a': nothing left to send" in r.output
    assert "'b': nothing left to send" in r.output
    assert "starting vLLM" not in r.output


@pytest.mark.integration
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_mid_run_interrupts_gracefully_and_resume_completes(sig, code, endpoint_matrix, ledger_path):
    with StubServer(StubConfig(ttft_ms=40, itl_ms=2)) as s:
        m = endpoint_matrix(s.base_url, warmup=0)
        p = subprocess.Popen([*CLI, "run", "--matrix", str(m), "--limit", "40", "--ledger", str(ledger_path), "-q",
                              "--no-grade", "--concurrency", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        _wait_rows(ledger_path, 8)
        p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == code, out
        assert "Traceback" not in out
        assert f"stopped by {signal.Signals(sig).name}" in out
        db = Database(ledger_path)
        run = next(db["runs"].rows)
        assert run["status"] == "interrupted"
        assert f"evalkit run --resume {run['id']}" in out
        assert 0 < len(finals(db)) < 40
        r = subprocess.run([*CLI, "run", "--resume", run["id"], "--ledger", str(ledger_path), "-q", "--no-grade"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    after = finals(db)
    assert len(after) == 40
    assert len(set(after)) == 40
    assert db["runs"].get(run["id"])["status"] == "complete"


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 1.7 MB filesystem for the ledger: its migrations fit, a run's rows do not (tmpfs: needs root)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1700k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.integration
def test_a_full_disk_is_one_line_and_resume_completes_once_there_is_room(tiny_fs, endpoint_matrix, tmp_path):
    ledger = tiny_fs / "l.db"
    with StubServer(StubConfig(ttft_ms=1, itl_ms=0, chars_per_chunk=1)) as s:
        m = endpoint_matrix(s.base_url, warmup=0)
        r = subprocess.run([*CLI, "run", "--matrix", str(m), "--ledger", str(ledger), "-q", "--no-grade",
                            "--concurrency", "16"], capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "Traceback" not in out
        assert len([x for x in out.splitlines() if x.startswith("Error:")]) == 1
        assert "cannot write the ledger" in out
        assert "evalkit run --resume" in out
        run_id = out.split("evalkit run --resume ")[1].split()[0]
        # room again: the same ledger on a bigger disk
        big = copy_ledger(ledger, tmp_path / "l.db")
        rep = subprocess.run([*CLI, "report", "--ledger", str(big), "--json"], capture_output=True, text=True)
        assert '"state": "running (stale' in rep.stdout or '"status": "interrupted"' in rep.stdout
        r = subprocess.run([*CLI, "run", "--resume", run_id, "--ledger", str(big), "-q", "--no-grade"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    db = Database(big)
    keys = finals(db)
    assert len(keys) == 144
    assert len(set(keys)) == 144  # the whole shipped dataset, once each
    assert db["runs"].get(run_id)["status"] == "complete"


def test_browse_stops_datasette_on_sigterm(tmp_path, stub_ledger):
    from .test_findings import _free_port

    port = _free_port()
    p = subprocess.Popen([*CLI, "browse", "--ledger", str(stub_ledger), "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    else:
        p.kill()
        raise AssertionError("Datasette did not start")
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 143, out
    time.sleep(0.5)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)  # nothing left serving the ledger


@pytest.mark.integration
def test_a_ledger_that_cannot_be_created_for_lack_of_room_is_one_line(endpoint_matrix, tmp_path):
    from evalkit.spawn import with_file_size_limit

    # the file-size limit a full disk imposes, without a filesystem to fill
    m = endpoint_matrix("http://127.0.0.1:9", warmup=0)
    r = subprocess.run(with_file_size_limit([*CLI, "run", "--matrix", str(m), "--ledger", str(tmp_path / "l.db"), "-q",
                                             "--no-grade"], 8192), capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out
    assert [x for x in out.splitlines() if x.startswith("Error:")] == [
        next(x for x in out.splitlines() if "cannot write the ledger" in x)]


def test_a_variant_stopped_after_its_last_request_is_complete_after_resume(runner, stub, endpoint_matrix, tmp_path):
    # the soak's finding: a signal between a variant's last row and its close left it `interrupted`
    # in a run the resume then completed
    ledger = tmp_path / "l.db"
    m = endpoint_matrix(stub.base_url, stub.base_url, warmup=0)
    assert runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "3", "--ledger", str(ledger), "-q",
                               "--no-grade"]).exit_code == 0
    db = Database(ledger)
    run = next(db["runs"].rows)
    db["runs"].update(run["id"], {"status": "interrupted"})
    db["variants"].update(f"{run['id']}:cand", {"status": "interrupted", "error": "stopped by SIGTERM"})
    r = runner.invoke(cli, ["run", "--resume", run["id"], "--ledger", str(ledger), "-q", "--no-grade"])
    assert r.exit_code == 0, r.output
    assert {v["name"]: v["status"] for v in db["variants"].rows} == {"base": "complete", "cand": "complete"}
    assert db["runs"].get(run["id"])["status"] == "complete"
