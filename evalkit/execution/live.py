"""One variant's life in a run: launch vLLM (or check the endpoint), record what it is, close it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..engines.bundled import resolve_model
from ..engines.checkpoint import checkpoint_quantization, served_dtype
from ..engines.memory import MemoryPlan, reported_weight_bytes, requests_that_fit
from ..engines.vllm_server import (
    VLLMServer,
    death_cause,
    engine_version,
    server_info,
    supports_per_request_metrics,
    tail,
    vllm_has_option,
)
from ..errors import EndpointError, EngineError
from ..ledger import Ledger, dumps, utcnow
from ..paths import cache_dir
from ..redact import redact, redact_args
from ..spec.matrix import Matrix, Variant, arg_value
from .signals import STOP


def auth_headers(variant: Variant) -> dict[str, str]:
    """The bearer token named by the matrix (`api_key_env`), read from the environment only."""
    if not variant.api_key_env:
        return {}
    key = os.environ.get(variant.api_key_env)
    if not key:
        raise EndpointError(f"variant '{variant.name}': environment variable {variant.api_key_env} is not set")
    return {"Authorization": f"Bearer {key}"}


class LiveVariant:
    """Brings one variant up (launching vLLM or checking the endpoint) and records it."""

    def __init__(self, ledger: Ledger, run_id: str, matrix: Matrix, variant: Variant, say: Callable[[str], None],
                 log_dir: Path, replica: int | None = None, kv_plan: MemoryPlan | None = None,
                 sleep_mode: bool = False) -> None:
        self.ledger, self.run_id, self.matrix, self.variant = ledger, run_id, matrix, variant
        self.say, self.log_dir = say, log_dir
        self.kv_plan = kv_plan  # this variant's share of the run's memory budget, planned before any start
        self.replica = replica  # None: the variant has one server
        self.vid = f"{run_id}:{variant.name}"
        self.rid = f"{run_id}:{variant.name}#{replica}"
        self.label = variant.name if replica is None else f"{variant.name}#{replica}"
        self.server: VLLMServer | None = None
        self.base_url = ""
        self.served = variant.served_model_name or variant.name
        self.headers: dict[str, str] = {}
        self.stage_s: dict[str, float] = {}  # prepare, start: how long each took
        self.died: str | None = None  # why its launched server is gone, if it died mid-run
        self.sleep_mode = sleep_mode  # `--order blocks` on a GPU: started with vLLM's sleep mode, to switch cheaply

    @property
    def model_path(self) -> str | None:
        return self.server.model_path if self.server else None

    def _record(self, fields: dict) -> None:
        """Variant-level facts go on the variant's row (written by its first server); each server
        of a replicated variant also has its own `replicas` row."""
        if not self.replica:
            self.ledger.update_variant(self.vid, fields)
        if self.replica is not None:
            keep = {k: v for k, v in fields.items() if k in ("model_path", "status", "error", "ready_s", "stopped_at",
                                                            "log_tail", "endpoint_url", "scrape_errors",
                                                            "scrape_last_error", "exit_code", "server_pid")}
            if keep:
                self.ledger.upsert_replica({"id": self.rid, **keep})

    def record_engine_cache(self, cfg: dict) -> None:
        """What the engine says its KV cache is (vllm:cache_config_info): the exact block count and
        size, next to what the budget planned."""
        fields: dict = {"cache_config_json": dumps(cfg)}
        try:
            blocks, bs = int(cfg["num_gpu_blocks"]), int(cfg["block_size"])
            fields.update({"kv_blocks": blocks, "kv_block_size": bs, "kv_tokens": blocks * bs})
        except (KeyError, TypeError, ValueError):
            pass
        self._record(fields)
        if self.kv_plan and fields.get("kv_blocks") is not None and fields["kv_blocks"] != self.kv_plan.kv_blocks:
            self.say(f"'{self.label}': the engine made {fields['kv_blocks']} KV blocks of the "
                                  f"{self.kv_plan.kv_blocks} planned from its budget")

    def record_capacity(self, mean_prompt_tokens: float, max_tokens: int) -> None:
        """How many of this run's requests (mean prompt + max_tokens) the engine's KV cache holds at
        once, from the block count the engine reported (vLLM keeps one block back)."""
        if self.replica:
            return
        v = self.ledger.variant(self.vid)
        if not v or not v.get("kv_blocks") or not v.get("kv_block_size"):
            return
        per = mean_prompt_tokens + max_tokens
        self.ledger.update_variant(self.vid, {"tokens_per_request": round(per, 1), "max_concurrency_predicted":
                                              requests_that_fit(v["kv_blocks"], v["kv_block_size"], per)})

    def record_scrapes(self, errors: int, last_error: str | None) -> None:
        """How many /metrics scrapes of this server failed (on the variant's row, and the replica's)."""
        self._record({"scrape_errors": errors, "scrape_last_error": last_error})

    def launch_args(self) -> list[str]:
        """The variant's vLLM arguments plus what evalkit adds to a launched server: the KV cache
        its memory budget leaves, and per-request timing in each response (when vLLM has it)."""
        args = self.variant.effective_vllm_args()
        if not self.variant.launched:
            return args
        if self.kv_plan is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_plan.kv_bytes)]
        if self.sleep_mode and "--enable-sleep-mode" not in args:
            args.append("--enable-sleep-mode")
        if self.matrix.telemetry.per_request_metrics and supports_per_request_metrics() \
                and "--enable-per-request-metrics" not in args:
            args.append("--enable-per-request-metrics")
        if vllm_has_option("--enable-prompt-tokens-details") and "--enable-prompt-tokens-details" not in args:
            args.append("--enable-prompt-tokens-details")  # each answer says how many prompt tokens were cached
        return args

    def open(self) -> None:
        v = self.variant
        args = self.launch_args()
        if self.replica is not None:
            self.ledger.upsert_replica({"id": self.rid, "run_id": self.run_id, "variant": v.name,
                                        "replica": self.replica, "endpoint_url": redact(v.endpoint_of(self.replica)),
                                        "node": os.uname().nodename, "status": "starting", "started_at": utcnow()})
        if self.replica:  # the variant's row is the first server's to write
            self._open()
            return
        self.ledger.upsert_variant({
            "id": self.vid, "run_id": self.run_id, "name": v.name,
            "is_baseline": int(v.name == self.matrix.baseline), "model": v.model,
            "engine": v.engine if v.launched else "endpoint",
            "server_args_json": dumps(redact_args(args)), "quantization": arg_value(args, "--quantization"),
            "dtype": arg_value(args, "--dtype"), "dtype_reason": v.dtype_reason(),
            "cost_json": dumps(v.cost.model_dump()) if v.cost else None,
            "endpoint_url": redact(v.endpoint_of(self.replica)), "status": "starting", "started_at": utcnow(),
            "node": os.uname().nodename, **(self.kv_plan.as_row() if self.kv_plan else {}),
        })
        self._open()

    def _open(self) -> None:
        v = self.variant
        args = self.launch_args()
        try:
            self.headers = auth_headers(v)
            if v.launched:
                assert v.model is not None
                t0 = time.monotonic()
                model_path = resolve_model(v.model, say=self.say)
                self.stage_s["prepare"] = time.monotonic() - t0
                log_path = self.log_dir / f"{self.run_id}-{self.label}.log"
                self.server = VLLMServer(model_path, self.served, args, log_path, env=v.env,
                                         cache_dir=cache_dir(), startup_timeout_s=v.startup_timeout_s)
                self.say(f"starting vLLM for '{self.label}' ({v.model}); log: {log_path}")
                self.server.should_stop = lambda: STOP.requested  # a signal during the start abandons it
                self.server.__enter__()
                self.stage_s["start"] = self.server.ready_s or 0.0
                self.base_url = self.server.base_url
                self.say(f"'{self.label}' ready in {self.server.ready_s:.0f} s at {self.base_url}")
                if self.replica is not None:
                    self.ledger.upsert_replica({"id": self.rid, "endpoint_url": self.base_url})
                self._record({"server_pid": self.server.proc.pid if self.server.proc else None})
                self._record({
                    "model_path": model_path, "served_model_name": self.served, "ready_s": self.server.ready_s,
                    "weight_bytes_reported": reported_weight_bytes(tail(self.server.log_path, 400)),
                    "server_args_json": dumps(self.server.recorded_args()),
                    "quantization": arg_value(args, "--quantization") or checkpoint_quantization(model_path),
                    "dtype": served_dtype(args, model_path),
                })
            else:
                self.base_url = v.endpoint_of(self.replica) or ""
                info = server_info(self.base_url, self.headers)
                if not info:
                    raise EndpointError(f"endpoint {self.base_url} is unreachable (no answer on /v1/models or /version)")
                data = info.get("models", {}).get("data") or []
                self.served = v.served_model_name or (data[0].get("id") if data else None) or v.name
                self._record({"served_model_name": self.served, "ready_s": 0.0})
            info = server_info(self.base_url, self.headers)
            remote = (info.get("version") or {}).get("version")
            ev = engine_version() if v.launched else "remote"
            self._record({
                "engine_version": f"{ev} (server /version: {remote})" if remote else ev,
                "models_json": redact(dumps(info.get("models"))), "status": "running",
            })
        except EngineError as e:
            self.fail(e)
            raise

    def can_sleep(self) -> bool:
        """A launched server started with vLLM's sleep mode can free its memory between blocks."""
        return self.server is not None and "--enable-sleep-mode" in self.launch_args()

    def sleep(self) -> None:
        """vLLM's sleep mode, level 1: weights to host memory, KV cache dropped (`--order blocks`)."""
        self._post("/sleep?level=1")
        self._record({"status": "asleep"})

    def wake(self) -> None:
        self._post("/wake_up")
        self._record({"status": "running"})

    def _post(self, path: str) -> None:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"{self.base_url}{path}", data=b"", method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.variant.startup_timeout_s) as r:
                r.read()
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"variant '{self.label}': POST {path} failed ({e}): was it started with "
                              "--enable-sleep-mode?") from None

    def server_died(self) -> str:
        """The launched server exited mid-run: record its exit code and log tail on the variant;
        returns the cause, for the requests it can no longer answer."""
        assert self.server is not None
        code = self.server.exit_code
        cause = redact(f"vLLM server for '{self.label}' {death_cause(code, self.server.log_path)} (during the run)")
        self.say(f"'{self.label}': {cause}")
        fields = {"status": "failed", "error": cause, "exit_code": code, "log_tail": redact(tail(self.server.log_path))}
        self._record(fields)
        if self.replica is not None:
            self.ledger.upsert_replica({"id": self.rid, **fields})
        self.died = cause
        return cause

    def fail(self, e: Exception) -> None:
        self._record({
            "status": "failed", "error": redact(str(e).splitlines()[0]),
            "log_tail": redact(tail(self.server.log_path)) if self.server else None,
        })
        self.close()

    def close(self, status: str | None = None, error: str | None = None) -> None:
        if self.died:  # failed already, with its cause
            status, error = None, None
        if status:  # a resumed variant that completes loses the cause of its earlier failure
            self._record({"status": status, "error": redact(error) if error else None})
        if self.server is not None:
            self.server.stop()  # the whole process group, also when the API server already exited
            self._record({"stopped_at": utcnow(), "log_tail": redact(tail(self.server.log_path)),
                          "exit_code": self.server.exit_code})
            self.server = None
