"""The live view: a table in a real terminal (a tmux pane) while `evalkit run` sends, plain
progress lines and no table when the output is a pipe."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.cli.liveview import Lane, LiveView, server_gauges
from evalkit.measure.client import RequestResult
from evalkit.testing.stub_server import StubConfig, StubServer

TITLE = "evalkit run: live"
EVALKIT = str(Path(sys.executable).parent / "evalkit")


@pytest.fixture
def slow_stub():
    # slow enough that a 24-request run lasts a few seconds: the pane is read while it sends
    with StubServer(StubConfig(ttft_ms=60, itl_ms=15, kv_tokens=100000, max_num_seqs=2)) as s:
        yield s


def _matrix(tmp_path: Path, url: str) -> Path:
    m = tmp_path / "m.yaml"
    m.write_text("name: live\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n  max_tokens: 12\n"
                 "  temperature: 0\n  extra_body: {ignore_eos: true}\n  structured_output: false\n"
                 f"variants:\n  - name: base\n    endpoint: {url}\n")
    return m


def _args(tmp_path: Path, url: str) -> list[str]:
    return [EVALKIT, "run", "--matrix", str(_matrix(tmp_path, url)), "--limit", "24", "--concurrency", "4",
            "--no-grade", "--ledger", str(tmp_path / "l.db")]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is installed by `make browser`")
def test_the_live_table_appears_in_a_terminal(slow_stub, tmp_path):
    session = f"evalkit-live-{time.monotonic_ns()}"
    cmd = "env -u COLUMNS -u LINES " + " ".join(_args(tmp_path, slow_stub.base_url)) + "; sleep 60"  # the pane's size
    tmux = ["tmux", "-L", session, "-f", "/dev/null"]  # a server of its own: no user's settings or sizes
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd], check=True)
    seen = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and TITLE not in seen:
            time.sleep(0.3)
            seen = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert TITLE in seen and "TTFT p50/p99" in seen and "KV %" in seen, seen


@pytest.mark.integration
def test_a_pipe_gets_progress_lines_and_no_table(slow_stub, tmp_path):
    out = subprocess.run(_args(tmp_path, slow_stub.base_url), capture_output=True, text=True, timeout=120)
    assert TITLE not in out.stdout + out.stderr and "progress base:" in out.stderr, out.stdout + out.stderr


@pytest.mark.integration
def test_the_server_gauges_come_from_its_metrics(slow_stub):
    kv, waiting = server_gauges(slow_stub.base_url)
    assert (kv, waiting) == (0.0, 0.0)


def test_a_server_without_metrics_shows_none():
    assert server_gauges("http://127.0.0.1:9") == (None, None)


def test_the_window_drops_what_is_older_than_it():
    lane = Lane("c=4", 10)
    lane.add(RequestResult(started_at="x"), now=0.0)
    lane.add(RequestResult(started_at="x"), now=100.0)
    assert len(lane.window(105.0)) == 1


def test_the_table_shows_each_variant_and_its_probe():
    from rich.console import Console

    view = LiveView(console=Console(file=open("/dev/null", "w"), force_terminal=True))
    view.lanes["w8a8"] = Lane("r=3.7", 40)
    row = [c._cells for c in view.table().columns]  # noqa: SLF001 (what the table holds, not how it draws)
    assert (row[0], row[1]) == (["w8a8"], ["r=3.7"])
