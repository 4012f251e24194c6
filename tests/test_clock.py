"""Timing the client's own load cannot bend: kernel receive stamps, the user-space stamp beside
them, a fallback that says so, the client's self-check, and several sending processes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.execution.inputs import RunInputs
from evalkit.execution.load import load_from_options
from evalkit.execution.runner import SilentProgress
from evalkit.execution.skeleton import run_matrix
from evalkit.ledger import open_ledger
from evalkit.measure import wire as wire_mod
from evalkit.measure.client import build_payload, stream_chat
from evalkit.measure.wire import WireClient, stream_chat_wire
from evalkit.paths import default_dataset_path
from evalkit.spec.dataset import load_cases
from evalkit.spec.matrix import load_matrix
from evalkit.testing.stub_server import StubConfig, StubServer

PAYLOAD = build_payload("stub-model", [{"role": "user", "content": "hello"}], max_tokens=8, temperature=0, seed=None)


async def _stall(cfg: StubConfig, stamps: dict[int, float], extra_s: float) -> None:
    """Block the client's loop from the moment the request reaches the stub until ``extra_s`` after
    the stub stamped the write in ``stamps``. Anchored on the stub's own clock (it runs in another
    thread), so a slow machine cannot move the stall off the write it is meant to cover."""
    while not cfg.arrivals:
        await asyncio.sleep(0.001)
    limit = time.monotonic() + 10
    while not stamps and time.monotonic() < limit:
        time.sleep(0.0005)  # blocks the loop: nothing is read while the stub writes
    time.sleep(extra_s)


async def _send(url: str, use_wire: bool) -> object:
    if use_wire:
        w = WireClient()
        try:
            return await stream_chat_wire(w, url, PAYLOAD, epoch=0.0)
        finally:
            w.close()
    async with aiohttp.ClientSession() as s:
        return await stream_chat(s, url, PAYLOAD, epoch=0.0)


def _stalled(s: StubServer, stamps: dict[int, float], extra_s: float, use_wire: bool = True) -> object:
    """One request whose client loop is blocked (`_stall`) until ``extra_s`` after the stub's write
    stamped in ``stamps``."""
    async def go():
        stall = asyncio.ensure_future(_stall(s.cfg, stamps, extra_s))
        try:
            return await _send(f"{s.base_url}/v1/chat/completions", use_wire)
        finally:
            await stall

    r = asyncio.run(go())
    assert r.ok, r.error
    return r


def _blocked(s: StubServer, use_wire: bool) -> tuple[float, float | None, object]:
    """One request whose client loop is blocked over its first token until 50 ms after the stub
    wrote it; returns the client's first-token time (perf_counter s) and its user-space one."""
    r = _stalled(s, s.cfg.stamps, 0.05, use_wire)
    return (r.mono_start_ms + r.ttft_ms) / 1000, ((r.mono_start_ms + r.ttft_user_ms) / 1000 if r.ttft_user_ms else None), r


@pytest.mark.integration
@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_a_blocked_loop_does_not_bend_the_kernel_stamp_and_the_user_column_shows_the_lag():
    # the next chunk comes 250 ms after the first, well after the 50 ms stall: nothing merges the first
    with StubServer(StubConfig(ttft_ms=60, itl_ms=250, role_chunk=False, stamp=True, fixed_chunks=3)) as s:
        first, first_user, r = _blocked(s, use_wire=True)
        n = max(s.cfg.stamps)
        pre, sent = s.cfg.pre_stamps[n], s.cfg.stamps[n]  # just before and just after the stub's write
    assert r.timestamp_source == "kernel"
    assert r.first_read_chunks == 1
    # the kernel stamped the first token inside the stub's write of it (0.2 ms: the clocks' conversion)
    assert pre - 0.0002 <= first <= sent + 0.0002, ((first - pre) * 1000, (sent - first) * 1000)
    assert (first - pre) * 1000 < 25  # and nowhere near the 50 ms the client's loop was blocked
    assert (first_user - first) * 1000 > 25  # the user-space stamp carries the client's 50 ms stall
    assert r.ttft_user_ms - r.ttft_ms > 25


@pytest.fixture
def end_stall():
    with StubServer(StubConfig(ttft_ms=20, itl_ms=5, role_chunk=False, stamp=True, fixed_chunks=4)) as s:
        r = _stalled(s, s.cfg.done_stamps, 0.06)  # the last chunks and [DONE] land while it is blocked
        n = max(s.cfg.done_stamps)
        done, closed = s.cfg.done_stamps[n], s.cfg.closed_stamps[n]
    return r, done, closed


@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_kernel_stamped_e2e_ends_inside_the_servers_last_writes(end_stall):
    r, done, closed = end_stall
    end = (r.mono_start_ms + r.e2e_ms) / 1000
    # between the stub's stamp before [DONE] and its stamp once the response was closed (0.2 ms:
    # the clocks' conversion), so not the client's 60 ms stall
    assert done - 0.0002 <= end <= closed + 0.0002, ((end - done) * 1000, (closed - end) * 1000)
    assert (end - done) * 1000 < 25


@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_the_user_space_e2e_beside_it_carries_the_client_stall(end_stall):
    r, _, _ = end_stall
    assert r.e2e_user_ms - r.e2e_ms > 25


@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_tpot_follows_the_kernel_stamped_e2e(end_stall):
    r, _, _ = end_stall
    assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / (r.completion_tokens - 1))


@pytest.mark.integration
@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_chunks_merged_while_the_loop_was_late_are_counted_so_the_row_is_marked():
    # chunks 5 ms apart during a 50 ms stall: TCP merges what the client did not read, and the merged
    # segment carries the newest time; the row says how many chunks share the first token's time
    with StubServer(StubConfig(ttft_ms=20, itl_ms=5, role_chunk=False, stamp=True)) as s:
        first, _, r = _blocked(s, use_wire=True)
        sent = s.cfg.stamps[max(s.cfg.stamps)]
    late_ms = (first - sent) * 1000
    assert r.first_read_chunks > 1 or late_ms < 2.0  # either exact, or visibly shared
    from evalkit.execution.rows import timing_suspect

    row = {"error_class": None, "ttft_ms": r.ttft_ms, "timestamp_source": "kernel",
           "first_read_chunks": r.first_read_chunks}
    assert timing_suspect(row, 50.0, 5.0) == (r.first_read_chunks > 1)


class _HeadOnly:
    """A connection whose response head came in one read without a kernel stamp."""

    def __init__(self, head: bytes) -> None:
        self.stamped, self.kernel, self._reads = True, False, [(head, 1.0, 1.0)]

    async def read(self):  # type: ignore[no-untyped-def]
        return self._reads.pop(0) if self._reads else None


@pytest.mark.parametrize(("head", "kernel"), [
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", True),  # the head times nothing
    (b"HTTP/1.1 200 OK\r\n\r\ndata: {}\n\n", False),  # body bytes came with the unstamped head
])
def test_an_unstamped_head_marks_the_response_user_timed_only_when_body_bytes_rode_with_it(head, kernel):
    conn = _HeadOnly(head)
    asyncio.run(wire_mod.Response(conn).read_head())  # type: ignore[arg-type]
    assert conn.kernel is kernel


@pytest.mark.skipif(not wire_mod.kernel_stamps_supported(), reason="kernel receive stamps need Linux")
def test_the_stamp_probe_keeps_a_socket_that_holds_stamping_on():
    assert wire_mod.kernel_stamps_ready()
    assert len(wire_mod._KEEPER) == 1


@pytest.mark.integration
def test_the_user_space_path_is_bent_by_the_same_stall_and_says_which_clock_it_used():
    with StubServer(StubConfig(ttft_ms=60, itl_ms=5, role_chunk=False, stamp=True)) as s:
        first, _, r = _blocked(s, use_wire=False)
        sent = s.cfg.stamps[max(s.cfg.stamps)]
    assert r.timestamp_source == "user"
    assert (first - sent) * 1000 > 25


@pytest.mark.integration
def test_keep_alive_chunked_bodies_and_every_fault_class_on_the_kernel_path():
    async def many(url: str, n: int, w: WireClient):
        return [await stream_chat_wire(w, url, PAYLOAD, timeout_s=1.0) for _ in range(n)]

    with StubServer(StubConfig(ttft_ms=1, itl_ms=1)) as s:
        w = WireClient()
        rs = asyncio.run(many(f"{s.base_url}/v1/chat/completions", 5, w))
        assert all(r.ok and r.text.startswith("This is a stub") for r in rs)
        assert s.cfg.counters["requests"] == 5
    for fault, cls in (("http_500", "http_500"), ("http_503", "http_503"), ("cut", "stream_cut"),
                       ("empty", "empty_completion"), ("stall", "timeout")):
        with StubServer(StubConfig(fault=fault, itl_ms=0, ttft_ms=0)) as s:
            r = asyncio.run(many(f"{s.base_url}/v1/chat/completions", 1, WireClient()))[0]
        assert r.error_class == cls, (fault, r.error_class, r.error)
    with StubServer(StubConfig(fault="http_429")) as s:
        r = asyncio.run(many(f"{s.base_url}/v1/chat/completions", 1, WireClient()))[0]
    assert r.error_class == "http_429"
    assert r.retry_after_s == 1.0
    assert "slow down" in r.error
    from evalkit.engines.vllm_server import free_port

    r = asyncio.run(many(f"http://127.0.0.1:{free_port()}/v1/chat/completions", 1, WireClient()))[0]
    assert r.error_class == "connect_error"
    assert r.http_status is None


@pytest.mark.integration
def test_fallbacks_record_their_source(runner, endpoint_matrix, tmp_path, monkeypatch):
    from evalkit.engines.vllm_server import free_port

    # TLS goes through aiohttp (user-space stamps), recorded per row, here a refused connection
    m = endpoint_matrix(f"https://127.0.0.1:{free_port()}", warmup=0)
    ledger = tmp_path / "tls.db"
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--ledger", str(ledger), "--limit", "1", "-q", "--no-grade"])
    assert r.exit_code == 2  # the endpoint is unreachable: refused before anything is sent, nothing silently fine
    # a platform without the socket option, or kernel_timestamps off, times in user space and says so
    monkeypatch.setattr("evalkit.execution.sender.kernel_stamps_supported", lambda: False)
    with StubServer(StubConfig()) as s:
        ledger = tmp_path / "nostamp.db"
        r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(s.base_url, warmup=0)), "--ledger", str(ledger),
                                "--limit", "2", "-q", "--no-grade"])
    assert r.exit_code == 0, r.output
    assert {x["timestamp_source"] for x in Database(ledger)["requests"].rows} == {"user"}


class Blocking(SilentProgress):
    """A progress sink that hogs the client's event loop for 60 ms per finished request."""

    def request_done(self, variant, case, result) -> None:  # noqa: ANN001
        time.sleep(0.06)


@pytest.mark.integration
def test_the_self_check_marks_a_run_whose_loop_was_blocked(runner, tmp_path, write):
    with StubServer(StubConfig(ttft_ms=30, itl_ms=10)) as s:
        m = write("m.yaml", "name: lag\nbaseline: base\ngeneration:\n  warmup: 0\n  baseline_repeats: 1\n"
                  "  structured_output: false\n  max_tokens: 16\ntelemetry:\n  kernel_timestamps: false\n"
                  f"variants:\n  - name: base\n    endpoint: {s.base_url}\n")
        ledger_path = tmp_path / "lag.db"
        ledger = open_ledger(ledger_path)
        summary = run_matrix(ledger, RunInputs.of(load_matrix(m), load_cases(default_dataset_path())[:12],
                                                  default_dataset_path(), load=load_from_options(None, concurrency=4)),
                             Blocking())
    rows = list(Database(ledger_path).query("select * from requests where is_warmup = 0"))
    assert rows
    assert {x["timestamp_source"] for x in rows} == {"user"}
    assert max(x["client_lag_max_ms"] for x in rows) > 40
    assert sum(x["timing_suspect"] for x in rows) >= len(rows) // 2
    assert Database(ledger_path)["client_lag"].count > 0
    rep = json.loads(runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--json"]).output)
    assert any("the client, not the server, was the bottleneck" in n for n in rep["notes"]), rep["notes"]
    html = tmp_path / "lag.html"
    assert runner.invoke(cli, ["report", "--ledger", str(ledger_path), "--html", str(html)]).exit_code == 0
    assert "the client, not the server, was the bottleneck" in html.read_text(encoding="utf-8")
    r = runner.invoke(cli, ["check", "--ledger", str(ledger_path), "--max-client-lag", "10"])
    assert r.exit_code == 1, r.output
    assert "FAIL base: client event-loop lag p99" in r.output, r.output
    assert summary.n_requests == 12


@pytest.mark.integration
def test_two_sending_processes_one_writer_one_schedule(runner, endpoint_matrix, tmp_path):
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as s:
        m = endpoint_matrix(s.base_url, warmup=0, structured=False)
        for args in (["--concurrency", "6", "--client-procs", "2"], ["--rate", "40", "--client-procs", "2"]):
            ledger = tmp_path / f"{args[0][2:]}.db"
            r = runner.invoke(cli, ["run", "--matrix", str(m), "--ledger", str(ledger), "--limit", "30", "-q",
                                    "--no-grade", *args])
            assert r.exit_code == 0, r.output
            rows = list(Database(ledger).query("select * from requests where is_warmup = 0 order by scheduled_ms"))
            assert len(rows) == 30
            assert {x["client_proc"] for x in rows} == {1, 2}
            assert all(x["error_class"] is None and x["ttft_ms"] > 0 for x in rows)
            assert len({(x["case_id"], x["repeat"]) for x in rows}) == 30  # each request once
            assert {x["proc"] for x in Database(ledger).query("select distinct proc from client_lag")} >= {1, 2}
            if args[0] == "--rate":  # one schedule across both processes: the seeded Poisson offsets
                from evalkit.execution.patterns import arrival_offsets

                offs = [x * 1000 for x in arrival_offsets(30, 40.0, "poisson", 0)]
                got = [x["scheduled_ms"] - rows[0]["scheduled_ms"] for x in rows]
                assert got == pytest.approx(offs, abs=0.01)
                assert max(x["client_wait_ms"] for x in rows) < 150  # each sent when it was due (a busy machine's lag aside)


def test_client_procs_must_be_positive(runner, endpoint_matrix, stub):
    r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(stub.base_url)), "--client-procs", "0", "-q",
                            "--concurrency", "2"])
    assert r.exit_code == 2
    assert "--client-procs must be at least 1" in r.output


def test_docs_define_the_new_columns():
    doc = (Path(__file__).parent.parent / "docs" / "measuring.md").read_text()
    for word in ("timestamp_source", "ttft_user_ms", "first_read_chunks", "client_lag", "timing_suspect",
                 "srv_resp_prefill_ms", "queue_time_ms"):
        assert word in doc, word


def test_the_lag_over_a_request_never_takes_a_window_that_began_after_it_ended():
    from evalkit.measure.looplag import LagProbe

    p = LagProbe.from_windows(0.0, [(100.0, 0.3), (200.0, 0.2), (300.0, 80.0)])
    assert p.max_between(120.0, 180.0) == pytest.approx(0.2)  # window (100, 200] only; (200, 300] began later


def test_the_lag_takes_every_window_a_request_overlapped():
    from evalkit.measure.looplag import LagProbe

    p = LagProbe.from_windows(0.0, [(100.0, 0.3), (200.0, 0.2), (300.0, 80.0)])
    assert p.max_between(150.0, 250.0) == pytest.approx(80.0)


@pytest.mark.integration
@pytest.mark.skipif(not wire_mod.kernel_stamps_ready(), reason="this kernel does not stamp TCP reads")
def test_the_realtime_offset_is_taken_per_request_on_a_pooled_connection(monkeypatch):
    taken = []

    def offset() -> int:
        taken.append(1)
        return 0

    monkeypatch.setattr(wire_mod, "realtime_offset_ns", offset)
    with StubServer(StubConfig(ttft_ms=1, itl_ms=1)) as s:
        async def two():
            w = WireClient()
            try:
                for _ in range(2):
                    await stream_chat_wire(w, f"{s.base_url}/v1/chat/completions", PAYLOAD, epoch=0.0)
                return len(w.idle[next(iter(w.idle))])
            finally:
                w.close()

        pooled = asyncio.run(two())
    assert pooled == 1  # one connection served both
    assert len(taken) == 3  # at connect, then once per request
