"""Before a run writes or sends anything: every endpoint variant answers at its URL, and every
launched server can be started here (its model path exists, the python that runs vLLM exists and
has vLLM). A wrong URL found after the whole baseline was sent costs the baseline; found here it
is one line, exit 2, and the ledger holds no request."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..engines.bundled import BUNDLED, PREFIX, is_bundled
from ..errors import EndpointError, UsageError
from ..redact import redact
from ..spec.matrix import Matrix, Variant
from .live import auth_headers

PROBE_TIMEOUT_S = 5.0


def _get(url: str, headers: dict[str, str]) -> int:
    """The HTTP status of a GET (an HTTP error's own status); connection failures raise."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=PROBE_TIMEOUT_S) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _why(e: BaseException) -> str:
    """A connection failure in a few words: refused, a name that does not resolve, no answer."""
    reason = getattr(e, "reason", e)
    if isinstance(reason, socket.gaierror):
        return "its host name does not resolve"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer in {PROBE_TIMEOUT_S:g} s"
    return str(reason).splitlines()[0] if str(reason) else type(reason).__name__


def probe(base_url: str, headers: dict[str, str] | None = None) -> str | None:
    """Why an OpenAI-compatible server does not answer at ``base_url`` (GET /v1/models, else
    /health or /version when the models list is not there), or None when it does. A server error
    (5xx) is an answer: the run's own retries and error classes take it from there."""
    headers = headers or {}
    try:
        status = _get(base_url + "/v1/models", headers)
        if status in (401, 403):
            return f"it refused the key (HTTP {status} on /v1/models)"
        if status != 404:
            return None
        if any(_get(base_url + path, headers) == 200 for path in ("/health", "/version")):
            return None
        return "HTTP 404 on /v1/models, /health and /version: no OpenAI-compatible server at that path"
    except (urllib.error.URLError, OSError) as e:
        return _why(e)


def _endpoint_problems(matrix: Matrix) -> list[str]:
    todo: list[tuple[Variant, str, dict[str, str]]] = []
    out = []
    for v in matrix.variants:
        if v.launched:
            continue
        try:
            headers = auth_headers(v)
        except EndpointError as e:
            out.append(str(e))
            continue
        todo += [(v, url, headers) for url in (v.endpoints or [v.endpoint or ""])]
    with ThreadPoolExecutor(max_workers=min(8, max(len(todo), 1))) as pool:
        whys = list(pool.map(lambda t: probe(t[1], t[2]), todo))
    out += [f"variant '{v.name}': endpoint {redact(url)} does not answer ({why})"
            for (v, url, _), why in zip(todo, whys, strict=True) if why]
    return out


def _looks_like_path(model: str) -> bool:
    """A model that can only be a local path (an HF id is `org/name`)."""
    return model.startswith(("/", "./", "../", "~"))


def vllm_python_problem() -> str | None:
    """Why the python that runs vLLM (EVALKIT_VLLM_PYTHON, else this one) cannot start it."""
    python = os.environ.get("EVALKIT_VLLM_PYTHON")
    if python:
        found = shutil.which(python)
        return None if found else f"EVALKIT_VLLM_PYTHON={python} is not an executable file"
    if os.environ.get("EVALKIT_VLLM_MODULE") or importlib.util.find_spec("vllm") is not None:
        return None
    return f"vLLM is not installed for {sys.executable}: install it, or name its interpreter in EVALKIT_VLLM_PYTHON"


def _launch_problems(matrix: Matrix) -> list[str]:
    out = []
    launched = [v for v in matrix.variants if v.launched and v.model]
    for v in launched:
        assert v.model is not None
        if is_bundled(v.model) and v.model[len(PREFIX):] not in BUNDLED:
            out.append(f"variant '{v.name}': unknown bundled model '{v.model}' (known: {', '.join(BUNDLED)})")
        elif _looks_like_path(v.model) and not Path(v.model).expanduser().exists():
            out.append(f"variant '{v.name}': model path {v.model} does not exist")
    if launched and (why := vllm_python_problem()):
        out.append(f"variant '{launched[0].name}' launches vLLM, but {why}")
    return out


def preflight(matrix: Matrix, *, local_launch: bool = True) -> None:
    """Refuse, in one line naming the variant and its URL or model, a run that would fail at a
    variant's start: an endpoint that does not answer, a key variable not set, a model path that
    does not exist, no vLLM to launch. ``local_launch``: launched servers start on this machine
    (on Ray they start on a node, whose paths are its own)."""
    problems = _endpoint_problems(matrix) + (_launch_problems(matrix) if local_launch else [])
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise UsageError(f"{problems[0]}{more}; nothing was sent")
