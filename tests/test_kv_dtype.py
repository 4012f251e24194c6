"""The KV cache's dtype as a variant axis: refused in one line on a processor that cannot serve
it, before any server starts; the capacity statement shows blocks, streams and max load per dtype."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.engines.kv_dtype import refuse_kv_dtypes
from evalkit.errors import MatrixError
from evalkit.reporting.load_curve import dtype_lines
from evalkit.spec.matrix import load_matrix

FP8 = ("name: kv\nbaseline: base\nvariants:\n  - name: base\n    model: bundled:smollm2-135m-instruct\n"
       "  - name: fp8kv\n    model: bundled:smollm2-135m-instruct\n    vllm_args: [--kv-cache-dtype, fp8]\n")


def _host(cpu_class: str, gpus: list | None = None) -> dict:
    return {"cpu_class": cpu_class, "gpu_json": json.dumps(gpus) if gpus else None}


@pytest.fixture
def fp8_matrix(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(FP8)
    return p


def test_an_fp8_kv_cache_is_refused_on_an_avx2_only_cpu(fp8_matrix):
    with pytest.raises(MatrixError, match="variant 'fp8kv': --kv-cache-dtype fp8 needs AVX-512"):
        refuse_kv_dtypes(load_matrix(fp8_matrix), _host("avx2"))


def test_an_fp8_kv_cache_is_served_on_avx512_bf16(fp8_matrix):
    assert refuse_kv_dtypes(load_matrix(fp8_matrix), _host("avx512_bf16")) is None


def test_a_gpu_host_leaves_the_kv_dtype_to_the_engine(fp8_matrix):
    assert refuse_kv_dtypes(load_matrix(fp8_matrix), _host("avx2", [{"name": "H200"}])) is None


@pytest.mark.integration
def test_evalkit_run_refuses_it_in_one_line_before_launching(fp8_matrix, tmp_path):
    env = {**os.environ, "EVALKIT_EMULATE_CPU": "avx2"}
    out = subprocess.run([str(Path(sys.executable).parent / "evalkit"), "run", "--matrix", str(fp8_matrix), "--limit",
                          "2", "--no-grade", "--ledger", str(tmp_path / "l.db")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert (out.returncode, "starting vLLM" in out.stderr, out.stderr.count("--kv-cache-dtype")) == (2, False, 1)


def test_the_capacity_statement_shows_each_dtype():
    variants = [{"name": "base", "server_args_json": "[]", "kv_blocks": 22, "max_concurrency_predicted": 5},
                {"name": "fp8kv", "server_args_json": json.dumps(["--kv-cache-dtype", "fp8"]), "kv_blocks": 44,
                 "max_concurrency_predicted": 10}]
    line = dtype_lines(variants, [], {}, {"base": 4, "fp8kv": 8})[0]
    assert "fp8kv (KV fp8): 44 blocks, 10 streams fit, max load concurrency 8" in line
