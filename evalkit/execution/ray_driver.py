"""The Ray driver process of `evalkit run --ray` (see `cluster.run_matrix_ray`): it joins or starts
Ray, submits one task per variant (or replica), forwards every worker's events to the process that
writes the ledger, and cancels them when asked. Ray ends its driver at once when the node under it
dies; the ledger is never in this process, so what the node took with it is still recorded.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EngineError, UsageError


def ray_init(address: str | None) -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'evalkit[ray]'") from None
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        try:
            if address in (None, "", "local"):
                ray.init(**kw)
            else:
                ray.init(address=address, **kw)
        except Exception as e:  # noqa: BLE001 - Ray raises bare Exceptions for a node that cannot start
            raise EngineError(f"Ray could not start or connect ({address or 'local'}): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ray


@dataclass
class Job:
    """One Ray task the driver process submits: its label, resources and shard."""

    label: str
    opts: dict[str, Any]
    shard: Any  # a `cluster.Shard`: what the task runs


def drive(address: str | None, jobs: list[Job], conn: Any, body: Callable[..., Any]) -> None:
    """The Ray driver, in a process of its own: submit ``body`` (`cluster.run_shard`) per job, forward
    every worker's events to the ledger's process as (label, event), cancel them when asked.
    Ray ends its driver abruptly when the node it runs on dies; the ledger is not in this process."""
    import signal

    os.setpgid(0, 0)  # its own group (same session): the ledger's process can reap whatever Ray left behind
    # ray.init puts a SIGTERM handler of its own in place (sys.exit: a traceback, and Ray's processes
    # left running): SIGTERM waits while it starts, then meets ours
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _die_with_parent()
    try:
        try:
            ray = ray_init(address)
        finally:
            _die_with_parent()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        remote = ray.remote(num_returns="streaming", max_retries=0)(body)
        gens = [(j.label, remote.options(**j.opts).remote(j.shard)) for j in jobs]
    except BaseException as e:  # said once, to the ledger's process, which records it on each variant
        try:
            conn.send(("", ("_driver_error", str(e).splitlines()[0] if str(e) else type(e).__name__)))
        except OSError:
            pass
        return
    out: queue.Queue[tuple[str, Any]] = queue.Queue()

    def pull(label: str, gen: Any) -> None:
        try:
            for ref in gen:
                out.put((label, ray.get(ref)))
        except Exception as e:  # the worker or its node died
            out.put((label, ("_failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")))
        out.put((label, ("_end",)))

    for label, gen in gens:
        threading.Thread(target=pull, args=(label, gen), daemon=True).start()
    open_streams = len(gens)
    try:
        while open_streams:
            if conn.poll():  # the only message: cancel (a signal reached the ledger's process)
                conn.recv()
                for _, gen in gens:
                    try:
                        ray.cancel(gen)
                    except Exception:  # noqa: BLE001 - a task that already ended
                        pass
            try:
                item = out.get(timeout=0.2)
            except queue.Empty:
                continue
            open_streams -= item[1][0] == "_end"
            conn.send(item)
        conn.send(("", ("_all_done",)))
    except (BrokenPipeError, EOFError, OSError):  # the ledger's process is gone: nobody to tell
        pass
    finally:
        ray.shutdown()


def _die_with_parent() -> None:
    """The driver process ends with the ledger's process, however that one ends (Linux), and takes
    its group with it: the Ray processes it started (Ray's agents outlive a driver killed alone).
    SIGTERM is the parent-death signal and what `terminate()` sends."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def reap_group(pgid: int) -> None:
    """Whatever the driver process's group still holds once it has ended (Ray's own processes
    after the driver was killed): none outlives the run."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_worker(pid: int, node: str) -> None:
    """A failed task's Ray worker, when it ran on this machine and still runs (checked by its
    process title, so a reused pid is never hit)."""
    import signal

    if node != os.uname().nodename:
        return
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if title.startswith(b"ray::"):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["Job", "drive", "ray_init", "reap_group", "reap_worker"]
