"""Findings: spikes and their attribution on constructed data with known answers; slices and
paired comparisons; recommend; HTML report rendered in headless Chromium; Datasette over HTTP;
publish --out loaded back with `datasets`."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.ledger import Ledger, open_ledger
from evalkit.reporting.findings import attribute_spike, parse_targets, recommend, spikes
from evalkit.reporting.report import paired
from evalkit.testing.stub_server import StubConfig, StubServer

from .report_golden import synth as _synth
from .test_verdicts import case_pairs_of


def _row(i: int, ttft: float, **kw) -> dict:
    base = {"id": i, "seq": i, "variant": "v", "complexity": "short", "case_id": f"c{i}", "repeat": 0, "concurrency": 1,
            "error_class": None, "ttft_ms": ttft, "e2e_ms": ttft + 1000, "srv_queue_ms": 0.0, "srv_prefill_ms": ttft - 5,
            "srv_preemptions": 0.0, "srv_waiting_start": 0.0, "srv_method": "histogram_delta", "grades": {}}
    base.update(kw)
    return base


def _spiky(tmp_path: Path, values: list[float] | dict[str, list[float]], complexity: str = "short"
           ) -> tuple[Ledger, str]:
    """A ledger whose run has each variant's TTFTs ``values`` (a list: the variant "base"), one
    slice each: cases of ``complexity`` at concurrency 1, sent in that order."""
    from evalkit.paths import default_dataset_path
    from evalkit.spec.dataset import load_cases

    by = values if isinstance(values, dict) else {"base": values}
    cases = [c for c in load_cases(default_dataset_path()) if c.complexity == complexity]
    db = open_ledger(tmp_path / "spiky.db")
    _synth().make_run(db, "r", list(by), [1], 1, cases)
    seq = iter(range(1, 10**6))
    db.insert_requests([{"run_id": "r", "variant": v, "case_id": cases[i % len(cases)].id, "repeat": i // len(cases),
                         "seq": next(seq), "is_warmup": 0, "final": 1, "attempt": 0, "concurrency": 1, "ttft_ms": x,
                         "e2e_ms": x + 1000, "srv_queue_ms": 0.0, "srv_prefill_ms": x - 5, "srv_preemptions": 0.0,
                         "srv_waiting_start": 0.0, "srv_method": "histogram_delta"}
                        for v, xs in by.items() for i, x in enumerate(xs)])
    return db, "r"


def _spikes_at(tmp_path: Path, values: list[float]) -> list[int]:
    db, run = _spiky(tmp_path, values)
    with db:
        return [s["request_id"] - 1 for s in spikes(db, run)]  # ids from 1, in seq order


@pytest.mark.parametrize(("values", "spikes_at"), [
    ([400, 410, 395, 405, 402, 398, 1740, 401], [6]),  # the study's lone 1740 ms spike among ~400 ms
    ([400.0] * 10, []),  # identical values: no spikes
    ([1, 2, 3], []),  # too few to say
    ([21.0, 21.0, 21.1, 21.0, 21.0, 21.8, 21.0, 21.0], []),  # near-zero spread: 0.8 ms above the median is no spike
])
def test_spikes_known_answer(tmp_path, values, spikes_at):
    assert _spikes_at(tmp_path, values) == spikes_at


def _rule_spikes(values: list[float], k: float = 3.5) -> list[int]:
    """The spike rule written out with sorted Python lists."""
    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        pos = (len(xs) - 1) / 2
        return xs[int(pos)] + (xs[-int(-pos)] - xs[int(pos)]) * (pos - int(pos))

    m = med(values)
    scale = max(1.4826 * med([abs(x - m) for x in values]), 0.01 * abs(m), 1e-9)
    floor = max(m * 1.10, m + 1.0)
    return [i for i, v in enumerate(values) if v > m + k * scale and v >= floor]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_spike_query_flags_what_the_rule_written_out_flags(tmp_path, seed):
    import random

    rng = random.Random(seed)
    values = [rng.gauss(400, 20) if i % 97 else rng.uniform(600, 2000) for i in range(5001)]
    assert _spikes_at(tmp_path, values) == _rule_spikes(values)


@pytest.mark.parametrize("kw, cause", [
    ({"srv_preemptions": 2.0}, "preemption"),
    ({"srv_queue_ms": 1200.0, "srv_prefill_ms": 395.0, "srv_waiting_start": 3.0}, "queued"),
    ({"srv_prefill_ms": 1700.0}, "cold/long prefill"),
    ({"srv_prefill_ms": 395.0}, "unexplained"),
    ({"srv_prefill_ms": None, "srv_queue_ms": None, "srv_method": None}, "unexplained"),
])
def test_spike_attribution(kw, cause):
    spike = _row(20, 1740.0, **kw)
    got, why = attribute_spike(spike, "ttft_ms", 1, (404.5, 399.5))
    assert got == cause, why


def test_first_request_on_a_server_is_called_cold():
    first = _row(1, 1740.0, srv_prefill_ms=390.0)
    assert attribute_spike(first, "ttft_ms", 1, (405.0, 400.0))[0] == "cold/long prefill"


def test_spike_lines_name_the_cause(tmp_path):
    db, run = _spiky(tmp_path, [400.0 + i % 3 for i in range(1, 12)] + [1740.34])  # its prefill: 1735.34 ms
    with db:
        s = list(spikes(db, run))
    assert len(s) == 1
    assert s[0]["cause"] == "cold/long prefill"
    assert "TTFT 1,740 ms" in s[0]["line"]
    assert "server prefill 1735 ms" in s[0]["line"]


def test_paired_comparison_has_ci_and_verdict_only_when_clear():
    rows = []
    for i in range(20):
        rows.append(_row(i, 866.93 + (i % 5), variant="bf16", complexity="long", case_id=f"c{i}"))
        rows.append(_row(100 + i, 1372.12 + (i % 7), variant="fp8", complexity="long", case_id=f"c{i}"))
    p = next(x for x in paired(case_pairs_of(rows, "bf16", "ttft_ms"), "ttft_ms") if x["complexity"] == "long")
    assert p["pairs"] == 20
    assert p["delta_pct"] == pytest.approx(58.5, abs=0.5)  # the study's +58 % TTFT tax
    assert p["ci_pct"][0] > 55
    assert p["verdict"] == "fp8 slower"
    noisy = [_row(i, 1000 + (-1) ** i * 300, variant="a", case_id=f"c{i}") for i in range(20)]
    noisy += [_row(100 + i, 1000 + (-1) ** (i + 1) * 300, variant="b", case_id=f"c{i}") for i in range(20)]
    q = next(x for x in paired(case_pairs_of(noisy, "a", "ttft_ms"), "ttft_ms") if x["complexity"] == "all")
    assert q["verdict"] == "no clear difference"


def test_recommend_uses_intervals(tmp_path):
    db, run = _spiky(tmp_path, {"base": [300.0 + i for i in range(30)], "w8a8": [3000.0 + i for i in range(30)]},
                     complexity="long")
    with db:
        out = recommend(db, run, parse_targets("ttft_p99=1000"))
    long = {o["variant"]: o["status"] for o in out if o["workload"] == "interactive long-input"}
    assert long == {"base": "meets", "w8a8": "misses"}
    with pytest.raises(Exception, match="METRIC_pNN"):
        parse_targets("latency=5")


def test_report_findings_cli(runner, stub_ledger):
    r = runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--by", "complexity,task"])
    assert r.exit_code == 0, r.output
    assert "paired comparisons" in r.output
    assert "slices by complexity, task" in r.output
    js = json.loads(runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--json"]).output)
    assert {"slices", "paired", "spikes", "capacity", "study_summary"} <= set(js["findings"])
    cap = js["findings"]["capacity"][0]
    assert cap["kv_tokens"] == 1024 * 16
    assert set(cap["max_concurrent_by_complexity"]) == {"short", "medium", "long"}
    r = runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--by", "colour"])
    assert r.exit_code == 2
    r = runner.invoke(cli, ["recommend", "--ledger", str(stub_ledger), "--target", "ttft_p99=1000,e2e_p50=5000"])
    assert r.exit_code == 0
    assert "interactive long-input: use" in r.output


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_report_renders_every_plot(runner, stub_ledger, tmp_path):
    html = tmp_path / "report.html"
    r = runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--html", str(html)])
    assert r.exit_code == 0, r.output
    text = html.read_text()
    assert "<script" not in text
    assert 'href="http' not in text
    assert "@import" not in text  # no scripts, no CDN
    assert text.count("<svg") >= 7  # CDFs, E2E boxes, scatter, KV/queue timelines, drift, formality
    for title in ("TTFT CDF", "E2E by variant", "TTFT vs prompt tokens", "KV-cache use", "Drift (1", "Formality"):
        assert title in text, title
    assert "src=" not in text  # self-contained: nothing fetched
    chromium = _chromium()
    assert chromium, "Chromium is needed for the rendering check (make test installs it)"
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1280,3000",
                    f"--screenshot={shot}", f"file://{html}"], check=True, capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None
    assert len(colours) > 50  # not blank: text, axes, coloured series
    blue = sum(n for n, (r_, g, b) in colours if b > 150 and r_ < 80 and g < 160)  # the first series colour
    assert blue > 200


@pytest.mark.integration
def test_generated_text_is_escaped_in_html(runner, endpoint_matrix, tmp_path):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    ledger = tmp_path / "l.db"
    with StubServer(StubConfig(fixed_text=evil, ttft_ms=1, itl_ms=0)) as s:
        runner.invoke(cli, ["run", "--no-grade", "--matrix", str(endpoint_matrix(s.base_url, structured=False)), "--limit", "3",
                            "--ledger", str(ledger), "-q"])
    assert Database(ledger)["requests"].count_where("text = ? and is_warmup = 0", [evil]) == 3  # stored verbatim
    html = tmp_path / "r.html"
    runner.invoke(cli, ["report", "--ledger", str(ledger), "--html", str(html)])
    text = html.read_text()
    assert evil not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text


def wait_for_json(url: str, tries: int = 100) -> object:
    """GET a JSON URL once the server behind it answers (Datasette takes a few seconds)."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_browse_serves_canned_queries_over_http(stub_ledger, tmp_path):
    from evalkit.cli import cli as _cli  # noqa: F401  (the same code path as `evalkit browse`)
    from evalkit.ledger import open_ledger
    from evalkit.sharing.browse import browse

    port = _free_port()
    p = browse(open_ledger(stub_ledger), stub_ledger, "127.0.0.1", port, meta_dir=tmp_path, wait=False)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_json(base + "/-/versions.json")
        name = stub_ledger.stem

        def get(path: str) -> dict:
            with urllib.request.urlopen(base + path, timeout=10) as r:
                return json.loads(r.read())

        summary = get(f"/{name}/study_summary.json?_shape=array")
        assert {x["variant"] for x in summary} == {"base", "cand"}
        fails = get(f"/{name}/failures.json?_shape=array")
        assert fails == []  # a canned query that correctly returns no rows
        drift = get(f"/{name}/requests_joined.json?_shape=array&_facet=complexity&_size=5")
        assert drift
        assert "complexity" in drift[0]
        page = urllib.request.urlopen(base + f"/{name}/requests", timeout=10).read().decode()
        assert "Requests (one row per request" in page
        assert "<dl" in page  # title + rendered JSON text
        meta = get("/-/metadata.json")
        assert "study_summary" in meta["databases"][name]["queries"]
        conns = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{port}" in conns
        assert f"0.0.0.0:{port}" not in conns
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_publish_out_loads_with_datasets(runner, stub_ledger, tmp_path, monkeypatch):
    import datasets

    out = tmp_path / "pub"
    r = runner.invoke(cli, ["publish", "--ledger", str(stub_ledger), "--out", str(out)])
    assert r.exit_code == 0, r.output
    db = Database(stub_ledger)
    for config, table in (("requests", "requests"), ("grades", "grades"), ("server_samples", "server_samples")):
        ds = datasets.load_dataset("parquet", data_files=str(out / config / "*.parquet"), split="train")
        assert ds.num_rows == db[table].count, config
    # as docs/publishing.md says to load it: a config of the folder by name
    assert datasets.load_dataset(str(out), "requests", split="train").num_rows == db["requests"].count
    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:")
    assert "config_name: requests" in card
    assert "TTFT" in card
    assert "| variant | n | err | TTFT tax % | TTFT tax short % |" in card
    # the push path, up to the hub call
    r = runner.invoke(cli, ["publish", "--ledger", str(stub_ledger), "--repo", "me/evalkit-run"])
    assert r.exit_code == 2
    assert "HF_TOKEN" in r.output
    calls = []

    class FakeApi:
        def create_repo(self, repo, **kw):
            calls.append(("create", repo, kw))

        def upload_folder(self, **kw):
            calls.append(("upload", kw["repo_id"], sorted(p.name for p in Path(kw["folder_path"]).iterdir())))

    from evalkit.sharing import publish as pub

    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    url = pub.push(out, "me/evalkit-run", True, api=FakeApi())
    assert url.endswith("me/evalkit-run")
    assert (calls[0] == ("create", "me/evalkit-run",
                                                          {"repo_type": "dataset", "private": True, "exist_ok": True}))
    assert "README.md" in calls[1][2]
    assert "requests" in calls[1][2]


def test_publish_refuses_anything_that_looks_like_a_secret(runner, stub_ledger, tmp_path):
    db = Database(stub_ledger)
    rid = next(db["requests"].rows)["id"]
    db["requests"].update(rid, {"text": "my key is sk-live-abcdefghijklmnopqrstuvwx"})
    out = tmp_path / "pub"
    r = runner.invoke(cli, ["publish", "--ledger", str(stub_ledger), "--out", str(out)])
    assert r.exit_code == 2
    assert "looks like a secret" in r.output
    assert "requests row" in r.output
    assert not out.exists()  # nothing half written


def test_one_declaration_adds_a_metric_everywhere(runner, stub_ledger, tmp_path, monkeypatch):
    """A report metric declared once in the catalogue appears in the terminal report, the HTML
    report and the dataset card; a request metric in Datasette's column descriptions."""
    from evalkit import catalogue
    from evalkit.sharing.browse import metadata

    p75 = catalogue.Metric("ttft_p75_ms", "TTFT p75", 0, "75th percentile TTFT", "ms", "ttft_ms", "p75")
    monkeypatch.setattr(catalogue, "REPORT", (*catalogue.REPORT, p75))
    monkeypatch.setattr(catalogue, "LATENCY_TABLE", (*catalogue.LATENCY_TABLE, "ttft_p75_ms"))
    monkeypatch.setattr(catalogue, "REQUEST", (*catalogue.REQUEST, catalogue.Metric("seq", "seq", 0, "send order")))
    assert "TTFT p75" in runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--markdown"]).output
    html = tmp_path / "r.html"
    runner.invoke(cli, ["report", "--ledger", str(stub_ledger), "--html", str(html)])
    assert "TTFT p75" in html.read_text(encoding="utf-8")
    runner.invoke(cli, ["publish", "--ledger", str(stub_ledger), "--out", str(tmp_path / "pub")])
    assert "TTFT p75" in (tmp_path / "pub" / "README.md").read_text(encoding="utf-8")
    assert metadata("x")["databases"]["x"]["tables"]["requests"]["columns"]["seq"] == "send order"
