"""Child processes that die with evalkit, with no Python run between fork and exec.

A pre-exec callback (Popen's) runs Python in the forked child while the parent holds SQLite connections, locks
and threads: a lock taken by another thread at fork time stays taken forever in the child, and
SQLite's own rule is that no connection crosses a fork. So a child is started plainly
(`start_new_session=True` gives it its own process group) and sets its parent-death signal in
its *own* code, after exec: `with_parent_death(argv)` runs the command through a few lines of
Python that ask Linux for SIGTERM when evalkit dies (even by kill -9), check that evalkit did
not already die in between, then exec the real command (the signal survives exec)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

# argv: parent pid, the program, its arguments. PR_SET_PDEATHSIG = 1; a parent gone before the
# prctl took effect shows as a changed parent pid: exit rather than outlive it.
LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "except OSError:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(143)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def with_parent_death(argv: list[str], python: str | None = None) -> list[str]:
    """``argv`` run so that it receives SIGTERM when this process dies (Linux; elsewhere the command
    runs as it is, and the normal stop path still applies)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [python or sys.executable, "-c", LAUNCHER, str(os.getpid()), *argv]


def with_file_size_limit(argv: list[str], nbytes: int) -> list[str]:
    """``argv`` with RLIMIT_FSIZE at ``nbytes`` (rounded down to whole KiB) and SIGXFSZ ignored, so a
    write past it fails with EFBIG as on a full disk: set by the shell before exec, not by Python
    in a forked child."""
    return ["bash", "-c", 'trap "" XFSZ; ulimit -f "$0"; exec "$@"', str(max(1, nbytes // 1024)), *argv]


def reap(proc: subprocess.Popen[Any], timeout: float) -> int:
    """Wait up to ``timeout`` s for ``proc`` to end, then kill it; its exit code either way."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
