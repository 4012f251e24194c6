"""The machine is part of the result: host facts parsed from /proc/cpuinfo (fixtures of both
kinds of processor seen on this machine kind), recorded per run, shown in every output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlite_utils import Database

from evalkit.cli import cli
from evalkit.host import cpu_class, describe_host, dtype_for, host_line, hosts_differ, parse_cpuinfo

FIX = Path(__file__).parent / "fixtures"


def _isa(name: str) -> dict[str, bool]:
    return parse_cpuinfo((FIX / name).read_text())["isa"]


def test_cpuinfo_of_an_avx2_only_epyc():
    cpu = parse_cpuinfo((FIX / "cpuinfo_avx2.txt").read_text())
    assert cpu["cpu_model"].startswith("AMD EPYC 7B12")
    assert cpu["cpu_vendor"] == "AuthenticAMD"
    assert cpu["threads"] == 2
    assert cpu["cores"] == 2
    assert cpu["isa"]["avx2"]
    assert not cpu["isa"]["avx512f"]
    assert not cpu["isa"]["avx512_bf16"]
    assert cpu_class(cpu["isa"]) == "avx2"


def test_cpuinfo_of_an_avx512_bf16_epyc_and_an_amx_xeon():
    isa = _isa("cpuinfo_avx512_bf16.txt")
    assert isa["avx512f"]
    assert isa["avx512_bf16"]
    assert isa["avx512_vnni"]
    assert not isa["amx_bf16"]
    assert cpu_class(isa) == "avx512_bf16"
    assert cpu_class(_isa("cpuinfo_amx.txt")) == "amx"


@pytest.mark.parametrize("fixture, gpu, dtype", [
    ("cpuinfo_avx2.txt", None, "float32"),
    ("cpuinfo_avx512_bf16.txt", None, "bfloat16"),
    ("cpuinfo_amx.txt", None, "bfloat16"),
    ("cpuinfo_avx2.txt", [{"name": "NVIDIA H200", "memory_mib": 143771.0, "driver": "570"}], "auto"),
])
def test_native_dtype_per_flag_set(fixture, gpu, dtype):
    got, why = dtype_for(_isa(fixture), gpu)
    assert got == dtype
    assert why


def test_host_row_line_and_warning():
    avx2 = describe_host((FIX / "cpuinfo_avx2.txt").read_text(), "MemTotal:       24641304 kB\n", [])
    avx512 = describe_host((FIX / "cpuinfo_avx512_bf16.txt").read_text(), "MemTotal:       24641304 kB\n", [])
    assert avx2["memory_gib"] == 23.5
    assert avx2["cpu_class"] == "avx2"
    assert avx2["id"] != avx512["id"]
    assert avx2["evalkit_version"]
    assert avx2["os"]
    line = host_line(avx2)
    assert "AMD EPYC 7B12" in line
    assert "(avx2;" in line
    assert "ISA avx2)" in line
    assert "no GPU" in line
    assert hosts_differ([avx2, avx2]) is None
    assert "different hosts" in hosts_differ([avx2, avx512, None])
    gpu = describe_host((FIX / "cpuinfo_avx2.txt").read_text(), "",
                        [{"name": "NVIDIA H200", "memory_mib": 143771.0, "driver": "570.1"}])
    assert "GPU NVIDIA H200 (143771.0 MiB, driver 570.1)" in host_line(gpu)


def test_run_records_its_host_and_progress_reaches_a_log(runner, stub, endpoint_matrix, ledger_path):
    m = endpoint_matrix(stub.base_url)
    r = runner.invoke(cli, ["run", "--matrix", str(m), "--limit", "12", "--ledger", str(ledger_path)])
    assert r.exit_code == 0, r.output
    # not a terminal: plain progress lines (the last at 100 %), a duration estimate before the
    # measured requests, and how long each stage took
    lines = r.output.splitlines()
    progress = [x for x in lines if "progress base:" in x]
    assert progress
    assert "12/12 (100 %), errors 0, TTFT p50" in progress[-1]
    assert "ETA" in progress[0]
    est = next(i for i, x in enumerate(lines) if "estimate: 'base' 12 requests take about" in x)
    assert est < lines.index(progress[0])
    assert any("'base' warm-up:" in x for x in lines)
    assert any("'base' measure:" in x for x in lines)
    assert any("graded" in x and "outputs in" in x for x in lines)
    db = Database(ledger_path)
    run = next(db["runs"].rows)
    host = db["hosts"].get(run["host_id"])
    assert host["cpu_class"] in ("amx", "avx512_bf16", "avx512", "avx2", "other")
    assert host["cores"] >= 1
    assert json.loads(host["isa_json"]).keys() >= {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert host_line(host) in r.output  # the report header names the machine


def test_emulating_an_avx2_only_processor_is_recorded_and_reaches_the_server(monkeypatch, tmp_path):
    """EVALKIT_EMULATE_CPU=avx2 on an AVX-512 BF16 machine: the host row says it is an emulation
    and shows AVX2-only flags, the default dtype follows (float32), and vLLM's environment caps
    torch's, oneDNN's and vLLM's own ISA probes."""
    from evalkit.engines.vllm_server import EMULATE_SHIM, VLLMServer
    from evalkit.errors import UsageError

    monkeypatch.setenv("EVALKIT_EMULATE_CPU", "avx2")
    h = describe_host((FIX / "cpuinfo_avx512_bf16.txt").read_text(), "MemTotal: 1024 kB\n", [])
    isa = json.loads(h["isa_json"])
    assert isa["avx2"]
    assert not any(v for k, v in isa.items() if k != "avx2")
    assert h["cpu_class"] == "avx2"
    assert "[emulating AVX2-only on a avx512_bf16 processor" in h["cpu_model"]
    assert "emulating AVX2-only" in host_line(h)
    assert dtype_for(isa, None)[0] == "float32"
    env = VLLMServer("m", "m", [], tmp_path / "log", cache_dir=tmp_path)._env()
    assert env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["PYTHONPATH"].split(":")[0] == str(EMULATE_SHIM)
    monkeypatch.setenv("EVALKIT_EMULATE_CPU", "avx512")
    with pytest.raises(UsageError, match="EVALKIT_EMULATE_CPU='avx512'"):
        describe_host((FIX / "cpuinfo_avx512_bf16.txt").read_text(), "", [])


@pytest.mark.integration
def test_the_emulation_shim_caps_torchs_isa_probes(tmp_path):
    """The shim itself, in a fresh interpreter as vLLM's server would load it."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    from evalkit.engines.vllm_server import EMULATE_SHIM

    probe = "import torch; print(torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported())"
    env = {**os.environ, "PYTHONPATH": str(EMULATE_SHIM), "EVALKIT_EMULATE_CPU": "avx2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_an_unknown_emulation_stops_the_run_before_anything_is_written(runner, stub, endpoint_matrix, ledger_path,
                                                                         monkeypatch):
    from evalkit.host import this_host

    monkeypatch.setenv("EVALKIT_EMULATE_CPU", "sse4")
    this_host.cache_clear()
    try:
        r = runner.invoke(cli, ["run", "--matrix", str(endpoint_matrix(stub.base_url)), "--limit", "2",
                                "--ledger", str(ledger_path)])
    finally:
        this_host.cache_clear()
    assert r.exit_code == 2
    assert "EVALKIT_EMULATE_CPU='sse4': the only emulation is avx2" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert "Traceback" not in r.output
    db = Database(ledger_path)
    assert not db["runs"].exists() or db["runs"].count == 0
    assert not db["cases"].exists() or db["cases"].count == 0
