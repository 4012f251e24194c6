from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evalkit.cli import cli
from evalkit.ledger import open_ledger
from evalkit.ledger.register import _OPEN, LEAKED
from evalkit.paths import PACKAGE_DIR, default_dataset_path
from evalkit.testing.stub_server import StubConfig, StubServer

from . import ledger_integrity


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as s:
        yield s


@pytest.fixture
def stub_pair() -> Iterator[tuple[StubServer, StubServer]]:
    with StubServer(StubConfig(ttft_ms=5, itl_ms=1)) as a, StubServer(StubConfig(ttft_ms=25, itl_ms=1)) as b:
        yield a, b


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return p

    return _write


@pytest.fixture
def endpoint_matrix(write: Callable[[str, str], Path]) -> Callable[..., Path]:
    def _make(*urls: str, warmup: int = 1, structured: bool = True, extra: str = "", baseline_repeats: int = 1) -> Path:
        names = ["base", "cand", "third"]
        lines = ["name: stubs", "baseline: base", "generation:", f"  warmup: {warmup}",
                 f"  baseline_repeats: {baseline_repeats}",
                 f"  structured_output: {str(structured).lower()}", "  max_tokens: 64", "variants:"]
        for n, u in zip(names, urls, strict=False):
            lines += [f"  - name: {n}", f"    endpoint: {u}"]
        return write("matrix.yaml", "\n".join(lines) + "\n" + extra)

    return _make


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def shipped_rows() -> list[dict]:
    return [json.loads(x) for x in default_dataset_path().read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def db(ledger_path: Path):
    with open_ledger(ledger_path) as led:
        yield led


@pytest.fixture
def stub_ledger(runner, stub_pair, endpoint_matrix, tmp_path) -> Path:
    a, b = stub_pair
    ledger = tmp_path / "l.db"
    r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(a.base_url, b.base_url, baseline_repeats=2)),
                            "--limit", "6", "--ledger", str(ledger), "-q"])
    assert r.exit_code == 0, r.output
    return ledger


# The unit tier (`make test-fast`): library functions with no server, no subprocess and no
# embedding model. Everything else is marked: `integration` (a stub server, a subprocess, Ray or the
# embedding model), `vllm` (the real engine), each declared on the test or its module, or implied by
# a fixture below that starts something. A unit-tier test that starts one anyway fails at once and
# says which mark it lacks (`_unit_tier_starts_nothing`): nothing lands in the fast tier by accident.
INTEGRATION_FIXTURES = {"stub", "stub_pair", "stub_ledger", "slow_candidate_ledger", "two_candidate_run",
                        "swept_ledger", "fake_vllm", "fake_models", "local_ray", "plugin_site", "end_stall",
                        "stub_matrix", "real_run", "soak"}


# Modules whose tests assert on wall-clock timing (a load, a rate, a verdict from latencies, the
# client's own lag): `serial`, run one at a time after the rest of the integration tier, which
# runs on both cores (`make test`). Another test's processes beside them would be load they did
# not plan.
SERIAL_MODULES = {"test_machine_load", "test_frontier", "test_capacity", "test_clock", "test_load", "test_verdicts",
                  "test_search", "test_timing"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not (item.get_closest_marker("vllm") or item.get_closest_marker("integration")) \
                and INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") and item.path.stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _unit_tier_starts_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("integration") or request.node.get_closest_marker("vllm"):
        return
    import asyncio
    import subprocess

    def refuse(what: str) -> Callable[..., Any]:
        def _refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"a unit-tier test started {what}: mark it @pytest.mark.integration")
        return _refuse

    popen = subprocess.Popen.__init__

    def only_the_query_worker(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        # a ledger's queries run in its query worker (evalkit/ledger/duck_worker.py): part of reading it
        if not any("import evalkit.ledger.duck_worker as w" in str(a) for a in list(args)):
            refuse("a subprocess")()
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(StubServer, "__enter__", refuse("a stub server"))
    monkeypatch.setattr(subprocess.Popen, "__init__", only_the_query_worker)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse("a subprocess"))


# --- the ledger is sacred (issue 45) ------------------------------------------------------------------
# A command closes every ledger it opens: one left to the garbage collector keeps its locks and its
# -wal open. Ledgers opened by evalkit's own code during a test must be closed when the test ends
# (a test's own ledgers are its fixtures' business). And when the session ends, every SQLite file
# the tests made passes another process's integrity check (tests/ledger_integrity.py).

def _evalkit_opened(where: str) -> bool:
    return where.startswith(str(PACKAGE_DIR) + "/")


@pytest.fixture(autouse=True)
def _commands_close_their_ledgers(request: pytest.FixtureRequest) -> Iterator[None]:
    if "tmp_path" in request.fixturenames:
        ledger_integrity.MADE_BY[str(request.getfixturevalue("tmp_path").resolve())] = request.node.nodeid
    before, leaked = set(_OPEN), len(LEAKED)
    yield
    left = [f"{path} (opened at {where})" for key, (path, where) in list(_OPEN.items())
            if key not in before and _evalkit_opened(where)]
    lost = [f"{path} (opened at {where})" for path, where in LEAKED[leaked:] if _evalkit_opened(where)]
    assert not left, f"evalkit code left ledgers open after the test: {left}"
    assert not lost, f"evalkit code left ledgers to the garbage collector: {lost}"


@pytest.fixture(autouse=True)
def _query_workers_end_with_the_test() -> Iterator[None]:
    """A ledger a test left open keeps its query worker (~70 MB) for as long as something holds the
    ledger (a module's fixture, a cache); a collected one's worker ends by itself. Ended here after
    each test, none are carried into the real-engine tier. A worker is started again by its
    ledger's next query, so a module's ledger still works."""
    yield
    from evalkit.ledger.duck_worker import RUNNING

    for worker in list(RUNNING):
        worker.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None) if factory is not None else None
    if base is None or not Path(base).exists():
        return
    # an xdist worker: its folder is under the controller's basetemp, which the controller checks
    # with what each worker registered (a deliberately broken file is known only to its worker)
    if hasattr(session.config, "workerinput"):
        ledger_integrity.save(Path(base))
        return
    ledger_integrity.load(Path(base))
    bad = ledger_integrity.check(Path(base))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"ledger integrity: {len(ledger_integrity.databases(Path(base)))} files checked by another "
                            f"process, {len(bad)} failed")
        for line in bad:
            reporter.write_line(f"CORRUPT: {line}", red=True)
    if bad:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
