"""The evaluation matrix: which variants to compare, how to serve them, how to generate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ..errors import MatrixError
from ..paths import default_matrix_path
from .config import load_yaml_model
from .divergence import Divergence
from .sizes import check_budget


def arg_value(args: list[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` in a vLLM argument list (the last one wins)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Generation(BaseModel):
    """Sampling settings sent with every request, identical for every variant."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(128, ge=1)
    suite_max_tokens: int | None = Field(None, ge=1, description="a cap on a suite item's own output length (each "
                                         "suite sets one: 64 for a letter, 512 for worked arithmetic)")
    temperature: float = Field(0.0, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    sampling_seed: int = Field(1234, description="each request's sampling seed is this + its repeat index")
    structured_output: bool = True
    warmup: int = Field(1, ge=0, description="requests sent first, stored flagged, excluded from stats")
    warmup_max_tokens: int = Field(16, ge=2, description="output tokens of a warm-up (enough to time decode)")
    baseline_repeats: int = Field(
        2, ge=1, description="passes of the baseline per repeat-set: beyond the run's --repeats, the baseline is sent "
                             "baseline_repeats - 1 more times per case, under seeds no candidate uses: drift's noise floor")
    timeout_s: float = Field(600.0, gt=0)
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into each request body")
    shared_prefix: str | None = Field(None, description="a system prompt every case shares (the platform's long "
                                                        "instructions): what a prefix cache can reuse")
    quality_under_load: bool = Field(
        False, description="also compare each case's output at the highest concurrency reached with its output at "
                           "concurrency 1 (greedy decoding): does batching or preemption change answers?")

    def baseline_passes(self, repeats: int) -> int:
        """How often the baseline is sent per case: the run's repeats, then the noise-floor passes."""
        return repeats + self.baseline_repeats - 1

    @model_validator(mode="after")
    def _greedy_for_load_quality(self) -> Generation:
        if self.quality_under_load and self.temperature != 0:
            raise ValueError("quality_under_load compares outputs across load levels: it needs greedy decoding "
                             "(temperature: 0)")
        return self


def check_url(v: str | None) -> str | None:
    if v is None:
        return v
    u = urlparse(v)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"not an http(s) URL: {v!r}")
    if u.username or u.password:
        raise ValueError("put credentials in api_key_env, not in the URL")
    return v.rstrip("/")


def check_key_env(v: str | None) -> str | None:
    if v is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
        raise ValueError("must be the NAME of an environment variable, not the key itself")
    return v


class Retry(BaseModel):
    """Retries are off by default: a retried request hides the tail a timing run exists to see."""

    model_config = ConfigDict(extra="forbid")
    max_retries: int = Field(0, ge=0, le=10)
    # not `on`: YAML 1.1 reads a bare `on:` key as the boolean true
    on_errors: list[str] = Field(default_factory=lambda: ["http_429", "http_503", "connect_error"])
    backoff_s: float = Field(1.0, ge=0)


class Telemetry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scrape: bool = True
    interval_s: float = Field(0.5, gt=0, le=60)
    per_request_metrics: bool = Field(True, description="launched servers return each request's own server timing "
                                                        "(--enable-per-request-metrics), read from the final chunk")
    kernel_timestamps: bool = Field(True, description="time each read by the kernel's receive time (plain http on "
                                                     "Linux); else the event loop's clock")
    client_lag_threshold_ms: float = Field(5.0, gt=0, description="event-loop lag above which a user-space timing "
                                                                  "is marked as one the client may have bent")
    machine_load: bool = Field(True, description="sample the machine's load about once a second beside the run "
                                                 "(env_samples: foreign CPU, steal, GPU clocks): a verdict whose sides "
                                                 "ran under different load says so")


class Load(BaseModel):
    """A matrix's default load (the command line overrides each field it gives): a bundled study
    such as `capacity` runs its sweep with `evalkit run --matrix capacity` alone."""

    model_config = ConfigDict(extra="forbid")
    sweep: list[int] | None = Field(None, description="concurrency levels, e.g. [1, 2, 4, 8]")
    concurrency: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0)
    stop_kv: float | None = Field(None, gt=0, le=1)
    stop_on_waiting: bool = Field(True, description="a sweep also stops at a level where a request waited for room")
    slo: str | None = Field(None, description="per-request limits: ttft=2000,e2e=10000 (ms) or ttft=3x (relative)")

    @field_validator("sweep")
    @classmethod
    def _levels(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(c < 1 for c in v)):
            raise ValueError("levels must be positive integers")
        return v


class Cost(BaseModel):
    """What serving a variant costs, to put $ per million tokens next to a hosted API's price."""

    model_config = ConfigDict(extra="forbid")
    usd_per_hour: float = Field(gt=0, description="price of the machine (or share of it) serving the variant")


class ReferencePrice(BaseModel):
    """A hosted API's list price, for the break-even comparison."""

    model_config = ConfigDict(extra="forbid")
    name: str = "hosted API"
    usd_per_m_input: float = Field(ge=0)
    usd_per_m_output: float = Field(ge=0)


DTYPE_NATIVE = "native"  # the fastest unquantized dtype this processor runs natively (see evalkit.host)


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    engine: Literal["vllm"] = "vllm"
    model: str | None = Field(None, description="local path, HF id, or bundled:NAME")
    endpoint: str | None = Field(None, description="existing OpenAI-compatible base URL: nothing is launched")
    endpoints: list[str] | None = Field(None, min_length=1,
                                        description="several servers of one model: cases are sharded over them")
    replicas: int = Field(1, ge=1, le=64, description="launched variants: this many servers, cases sharded over them")
    resources: dict[str, float] | None = Field(
        None, description="what one replica needs on a Ray cluster, e.g. {num_gpus: 1} (default: from "
                          "--tensor-parallel-size, else one CPU)")
    served_model_name: str | None = None
    vllm_args: list[str] = Field(default_factory=list, description="passed to the vLLM server verbatim")
    env: dict[str, str] = Field(default_factory=dict)
    api_key_env: str | None = Field(None, description="name of the environment variable holding the key")
    startup_timeout_s: float = Field(900.0, gt=0)
    dtype: str | None = Field(None, description="'native' (bf16 where the CPU has AVX-512 BF16/AMX, float32 otherwise; "
                                                "auto on a GPU) or a vLLM --dtype value; recorded per variant")
    cost: Cost | None = None
    memory_budget: str | None = Field(None, description="weights + KV cache for this launched variant: a size "
                                                        "(600MiB) or a multiple of the baseline's weights (1.25x)")

    _budget = field_validator("memory_budget", mode="before")(lambda v: check_budget(v))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be letters, digits, '_', '.', '-' (and start with a letter or digit)")
        return v

    _url = field_validator("endpoint")(lambda v: check_url(v))
    _urls = field_validator("endpoints")(lambda v: [check_url(u) for u in v] if v else v)
    _key = field_validator("api_key_env")(lambda v: check_key_env(v))

    @model_validator(mode="after")
    def _model_or_endpoint(self) -> Variant:
        if self.endpoint and self.endpoints:
            raise ValueError("give `endpoint` or `endpoints`, not both")
        if self.endpoints and len(self.endpoints) == 1:
            self.endpoint, self.endpoints = self.endpoints[0], None
        if self.endpoints and self.model:
            raise ValueError("`endpoints` call running servers: drop `model`")
        if self.replicas > 1 and not self.model:
            raise ValueError("`replicas` launches servers: give a model (for running servers, list `endpoints`)")
        if not self.model and not self.endpoint and not self.endpoints:
            raise ValueError("give a model to launch or an endpoint to call")
        if self.endpoint and (self.vllm_args or self.dtype):
            raise ValueError("vllm_args and dtype apply only to launched servers, not to an endpoint")
        if self.dtype and any(a == "--dtype" or a.startswith("--dtype=") for a in self.vllm_args):
            raise ValueError("give the dtype once: either `dtype:` or `--dtype` in vllm_args")
        if self.memory_budget and not self.launched:
            raise ValueError("memory_budget sizes the KV cache of a server evalkit launches, not of an endpoint")
        if self.memory_budget and arg_value(self.vllm_args, "--kv-cache-memory-bytes"):
            raise ValueError("give memory_budget or --kv-cache-memory-bytes, not both")
        return self

    def resolved_dtype(self) -> str | None:
        if self.dtype != DTYPE_NATIVE:
            return self.dtype
        from ..host import native_dtype

        return native_dtype()[0]

    def dtype_reason(self) -> str | None:
        if self.dtype != DTYPE_NATIVE:
            return f"set in the matrix: {self.dtype}" if self.dtype else None
        from ..host import native_dtype

        return native_dtype()[1]

    def effective_vllm_args(self) -> list[str]:
        """vllm_args plus `--dtype` when the matrix sets one (resolving 'native' on this host)."""
        d = self.resolved_dtype()
        return [*self.vllm_args, "--dtype", d] if d else list(self.vllm_args)

    @property
    def launched(self) -> bool:
        return self.endpoint is None and not self.endpoints

    @property
    def n_replicas(self) -> int:
        return len(self.endpoints) if self.endpoints else self.replicas

    def endpoint_of(self, replica: int | None) -> str | None:
        return self.endpoints[replica or 0] if self.endpoints else self.endpoint

    def ray_resources(self) -> dict[str, float]:
        """What one replica asks a Ray cluster for: `resources:` as given (num_cpus / num_gpus /
        custom), else GPUs from --tensor-parallel-size when launched with one, else one CPU."""
        res = dict(self.resources or {})
        if not res and self.launched:
            tp = arg_value(self.vllm_args, "--tensor-parallel-size") or arg_value(self.vllm_args, "-tp")
            if tp:
                res["num_gpus"] = float(tp)
        res.setdefault("num_cpus", 1.0)
        return res


class Judge(BaseModel):
    """An optional LLM-as-judge: an OpenAI-compatible endpoint grading each output per criterion."""

    model_config = ConfigDict(extra="forbid")
    endpoint: str
    model: str
    api_key_env: str | None = None
    max_tokens: int = Field(200, ge=1)
    structured_output: Literal["auto", "on", "off"] = Field(
        "auto", description="constrain the judge's answer to {score: 1-5, reason} (a JSON schema `response_format`): auto = "
        "when the endpoint is a vLLM server (its /version answers), on = always, off = never; a server that "
        "refuses it (HTTP 400) is asked again plainly, and the grade says so")
    concurrency: int = Field(4, ge=1, le=64, description="judge requests in flight at once (a served model "
                             "batches them)")
    see_reasoning: bool = Field(False, description="show the judge a reasoning model's thinking beside its answer "
                                                   "(other graders read the answer alone)")
    criteria: dict[str, str] = Field(
        default_factory=lambda: {
            "persona_fit": "Does the text address the named recipient persona in a way that persona would value?",
            "faithfulness": "Does the text use only facts from the candidate profile and job information?",
        },
        min_length=1,
    )

    _url = field_validator("endpoint")(lambda v: check_url(v))
    _key = field_validator("api_key_env")(lambda v: check_key_env(v))


class Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    baseline: str
    generation: Generation = Field(default_factory=Generation)
    retry: Retry = Field(default_factory=Retry)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    judge: Judge | None = None
    cost: Cost | None = Field(None, description="default price for variants that give none")
    reference_price: ReferencePrice | None = None
    memory_budget: str | None = Field(None, description="one budget (weights + KV cache) for every launched variant "
                                                        "that gives none: a size (600MiB) or 1.25x the baseline's "
                                                        "weights")
    load: Load = Field(default_factory=Load)
    divergence: Divergence = Field(default_factory=Divergence)  # teacher-forced scoring (spec/divergence.py)
    limit: int | None = Field(None, ge=1, description="run a stratified subset of this many cases unless --limit is "
                                                    "given (a bundled study sizes itself)")
    margins: dict[str, str | float] = Field(
        default_factory=dict, description="non-inferiority margins per metric, e.g. {drift: 0.05, schema_pass: -2pp, "
                                          "e2e_mean: +0%}: each variant gets a verdict per metric")
    graders: list[str] | None = Field(
        None, description="graders to run: names (schema, drift, persona, formality, ...) or module:Class from the "
                          "workload folder [default: every default grader whose case fields the dataset carries]")
    suites: list[str] = Field(default_factory=list, description="evaluation suites run beside the cases, graded for "
                              "accuracy: instructions, arithmetic, choice, or gsm8k/mmlu/arc/ifeval:FILE (docs/suites.md)")
    dataset: str | None = Field(None, description="the workload's cases, a path relative to this file "
                                                  "[default: dataset.jsonl beside it, else the shipped resume cases]")
    schemas: str | None = Field(None, description="a folder of NAME.schema.json, relative to this file "
                                                  "[default: schemas/ beside it when there is one]")
    default_schema: str | dict[str, Any] | None = Field(
        None, description="the schema of every case that names none: a name (schemas/NAME.schema.json, then the "
                          "shipped ones), a path relative to the dataset, or inline; checked as a case's is")
    rubrics: str | None = Field(None, description="a folder of rubric files for the graders that read them; a file "
                                                  "not there comes from the shipped rubrics [default: rubrics/ beside "
                                                  "it when there is one]")
    variants: list[Variant] = Field(min_length=1)
    _folder: Path | None = PrivateAttr(None)  # the workload folder: where this matrix was read from

    _budget = field_validator("memory_budget", mode="before")(lambda v: check_budget(v))

    @property
    def folder(self) -> Path | None:
        return self._folder

    def workload_path(self, field: str, default: str) -> Path | None:
        """A path the matrix names (relative to its folder), or the conventional one beside it."""
        if self._folder is None:
            return None
        given = getattr(self, field)
        p = self._folder / (given or default)
        if given and not p.exists():
            raise MatrixError(f"{self._folder}: field '{field}': {p} does not exist")
        return p if p.exists() else None

    @model_validator(mode="after")
    def _names(self) -> Matrix:
        seen: set[str] = set()
        for v in self.variants:
            if v.name in seen:
                raise ValueError(f"duplicate variant name '{v.name}'")
            seen.add(v.name)
        if self.baseline not in seen:
            raise ValueError(f"baseline '{self.baseline}' is not one of the variants ({', '.join(seen)})")
        if self.cost:
            for v in self.variants:
                v.cost = v.cost or self.cost
        if self.memory_budget:
            for v in self.variants:
                if v.launched and not arg_value(v.vllm_args, "--kv-cache-memory-bytes"):
                    v.memory_budget = v.memory_budget or self.memory_budget
        return self

    def load_cases(self, path: str | Path | None) -> list[Any]:
        """The cases of a dataset as this matrix reads them: its workload's schemas first, its
        `default_schema` for the rows that name none."""
        from .dataset import load_cases

        return load_cases(path, self.workload_path("schemas", "schemas"), self.default_schema)

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def ordered_variants(self) -> list[Variant]:
        """Baseline first, then the others in file order."""
        return [self.variant(self.baseline)] + [v for v in self.variants if v.name != self.baseline]


def bundled_matrices() -> list[str]:
    return sorted(p.stem for p in default_matrix_path().parent.glob("*.yaml"))


def matrix_file(path: str | Path | None = None) -> Path:
    """Where a matrix is read from: a file, a workload folder's matrix.yaml, or a bundled one by
    name (`default`, the embedded default, when none is given)."""
    p = Path(path) if path else default_matrix_path()
    if path and not p.exists() and str(path) in bundled_matrices():
        p = default_matrix_path().parent / f"{path}.yaml"
    if p.is_dir():
        p = p / "matrix.yaml"
    return p  # a missing one is refused by whoever reads it, naming it


def load_matrix(path: str | Path | None = None) -> Matrix:
    """A matrix file, a workload folder (its matrix.yaml), or the name of a bundled one
    (`default`, `saturation`). A matrix outside the package is its workload folder's: its
    dataset, schemas, rubrics and graders' modules are found beside it."""
    p = matrix_file(path)
    m = load_yaml_model(p, Matrix, MatrixError, "matrix")
    if p.resolve().parent != default_matrix_path().resolve().parent:
        m._folder = p.resolve().parent
    return m


WORKLOAD_FIELDS = ("dataset", "schemas", "rubrics", "default_schema", "graders")


def with_workload(m: Matrix, folder: str | Path) -> Matrix:
    """Another matrix over a workload folder (`run --workload DIR --matrix FILE`): its variants,
    generation, load and margins, the folder's cases, schemas, rubrics and grader modules. The
    folder is the matrix's folder (its paths resolve there); what it leaves unset of
    ``WORKLOAD_FIELDS`` comes from the folder's own matrix.yaml, when it has one."""
    root = Path(folder).resolve()
    if (root / "matrix.yaml").is_file():
        own = load_matrix(root)
        for f in WORKLOAD_FIELDS:
            if getattr(m, f) is None:
                setattr(m, f, getattr(own, f))
    m._folder = root
    return m


def matrix_summary(m: Matrix) -> str:
    """`name: base (baseline), w8a8`: what `matrix validate` says."""
    return f"{m.name}: " + ", ".join(v.name + (" (baseline)" if v.name == m.baseline else "") for v in m.variants)
