"""Reading the machine's load from /proc and /sys, with the root injectable so tests run on fixture
files: CPU time (/proc/stat), each process's CPU time and parent (/proc/<pid>/stat), process trees,
the process listening on a TCP port (/proc/net/tcp{,6} inode -> /proc/<pid>/fd socket links),
load average, memory and its pressure (PSI), and the CPU clock.

Every reader returns None (or an empty result) where the file is missing or unreadable: a
container without PSI or a kernel without cpufreq gives nulls, never an error.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

LISTEN = "0A"  # TCP state of a listening socket in /proc/net/tcp


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate `cpu` line of /proc/stat, in clock ticks (USER_HZ), and how many CPUs it sums."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    n_cpus: int

    @property
    def busy(self) -> int:
        # Time that processes ran (guest time is inside user/nice already). Interrupt time is left
        # out: no process is charged for it, so it could only ever read as a neighbour's.
        return self.user + self.nice + self.system

    @property
    def total(self) -> int:
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal


_TIME_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The `cpu` line of /proc/stat (older kernels lack the last columns: they read 0)."""
    agg: list[int] | None = None
    n = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            agg = [int(x) for x in line.split()[1:]]
        elif line.startswith("cpu") and line[3:4].isdigit():
            n += 1
    if agg is None or len(agg) < 4:
        return None
    agg = (agg + [0] * 8)[:8]
    return CpuTimes(*agg, n_cpus=n or os.cpu_count() or 1)


def parse_per_cpu(text: str) -> dict[int, CpuTimes]:
    """Each `cpuN` line of /proc/stat, by N (each sums one CPU)."""
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *vals = line.split()
            if len(vals) >= 4:
                out[int(name[3:])] = CpuTimes(*([int(x) for x in vals] + [0] * 8)[:8], n_cpus=1)
    return out


def sum_cpus(per_cpu: Mapping[int, CpuTimes], cpus: Iterable[int]) -> CpuTimes | None:
    """The times of a set of CPUs, as if /proc/stat had a line for just them (None if none is there)."""
    got = [per_cpu[c] for c in cpus if c in per_cpu]
    if not got:
        return None
    return CpuTimes(*(sum(getattr(t, f) for t in got) for f in _TIME_FIELDS), n_cpus=len(got))


def affinity(pids: Iterable[int]) -> set[int]:
    """The CPUs any of these processes may run on (those that have ended are skipped)."""
    out: set[int] = set()
    for pid in pids:
        try:
            out |= os.sched_getaffinity(pid)
        except (OSError, AttributeError):  # gone, or no affinity on this platform
            continue
    return out


@dataclass(frozen=True)
class ProcStat:
    """What one /proc/<pid>/stat line says that load attribution needs (ticks in USER_HZ)."""

    ppid: int
    utime: int
    stime: int
    cutime: int  # CPU of children it has reaped: a short-lived child's time lands here
    cstime: int

    @property
    def ticks(self) -> int:
        return self.utime + self.stime + self.cutime + self.cstime


def parse_pid_stat(text: str) -> ProcStat | None:
    """Fields after the command name, which may itself hold spaces and parentheses: split after
    the last ')'. Field 4 is the parent, 14-17 utime, stime, cutime, cstime (man 5 proc)."""
    try:
        rest = text[text.rindex(")") + 2:].split()
        return ProcStat(int(rest[1]), int(rest[11]), int(rest[12]), int(rest[13]), int(rest[14]))
    except (ValueError, IndexError):
        return None


def parse_loadavg(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_psi_some_avg10(text: str) -> float | None:
    """`some avg10` of a PSI file: the share (%) of the last 10 s some task waited on the resource."""
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def parse_mem_available_mb(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return round(int(line.split()[1]) / 1024, 1)  # kB
            except (ValueError, IndexError):
                return None
    return None


def parse_cpuinfo_mhz(text: str) -> float | None:
    """The mean of /proc/cpuinfo's `cpu MHz` lines (what x86 shows where cpufreq is absent)."""
    vals = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                vals.append(float(value))
            except ValueError:
                continue
    return round(sum(vals) / len(vals), 1) if vals else None


def listening_inodes(text: str, port: int) -> set[int]:
    """Socket inodes listening on ``port`` (any address) in a /proc/net/tcp or tcp6 table."""
    out: set[int] = set()
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or f[3] != LISTEN:
            continue
        try:
            if int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(int(f[9]))
        except (ValueError, IndexError):
            continue
    return out


class ProcFS:
    """/proc and /sys under a root ("/" on the machine; a tmp dir of fixture files in tests)."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)
        self.proc = self.root / "proc"

    def read(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def cpu_times(self) -> CpuTimes | None:
        text = self.read("proc/stat")
        return parse_proc_stat(text) if text is not None else None

    def cpu_times_both(self) -> tuple[CpuTimes | None, dict[int, CpuTimes]]:
        """The aggregate line and each CPU's, from one read of /proc/stat."""
        text = self.read("proc/stat")
        return (parse_proc_stat(text), parse_per_cpu(text)) if text is not None else (None, {})

    def _pid_dirs(self) -> list[os.DirEntry[str]]:
        """The /proc/<pid> folders there are now (none when /proc cannot be read)."""
        try:
            return [d for d in os.scandir(self.proc) if d.name.isdigit()]
        except OSError:
            return []

    def processes(self) -> dict[int, ProcStat]:
        """Every process readable now: pid -> its stat. A process that ends mid-scan is skipped."""
        out: dict[int, ProcStat] = {}
        for d in self._pid_dirs():
            try:
                with open(os.path.join(d.path, "stat"), encoding="utf-8", errors="replace") as f:
                    st = parse_pid_stat(f.read())
            except OSError:
                continue
            if st is not None:
                out[int(d.name)] = st
        return out

    def load1(self) -> float | None:
        text = self.read("proc/loadavg")
        return parse_loadavg(text) if text is not None else None

    def mem_pressure(self) -> float | None:
        text = self.read("proc/pressure/memory")
        return parse_psi_some_avg10(text) if text is not None else None

    def mem_available_mb(self) -> float | None:
        text = self.read("proc/meminfo")
        return parse_mem_available_mb(text) if text is not None else None

    def cpu_mhz(self) -> float | None:
        """The mean of every readable cpufreq `scaling_cur_freq` (kHz), else /proc/cpuinfo's."""
        vals = []
        for p in sorted((self.root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
            try:
                vals.append(int(p.read_text().strip()) / 1000.0)
            except (OSError, ValueError):
                continue
        if vals:
            return round(sum(vals) / len(vals), 1)
        text = self.read("proc/cpuinfo")
        return parse_cpuinfo_mhz(text) if text is not None else None

    def listeners(self, port: int) -> set[int]:
        """PIDs holding a socket that listens on ``port``: the socket inodes from /proc/net/tcp
        and tcp6, then each process's fd links that read `socket:[inode]`. Only processes whose
        fds we may read are found (our own user's, or all as root)."""
        inodes: set[int] = set()
        for table in ("proc/net/tcp", "proc/net/tcp6"):
            text = self.read(table)
            if text:
                inodes |= listening_inodes(text, port)
        if not inodes:
            return set()
        wanted = {f"socket:[{i}]" for i in inodes}
        out: set[int] = set()
        for d in self._pid_dirs():
            try:
                fds = list(os.scandir(os.path.join(d.path, "fd")))
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        out.add(int(d.name))
                        break
                except OSError:
                    continue
        return out


def descendants(procs: dict[int, ProcStat], roots: Iterable[int]) -> set[int]:
    """The roots that are alive and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st.ppid, []).append(pid)
    out: set[int] = set()
    stack = [r for r in roots if r in procs]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


def local_port(url: str) -> int | None:
    """The port of an endpoint URL when its host is this machine, else None (a server on another
    host: nothing here to attribute). Resolves names, so call it once per URL, not every sample."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not host:
        return None
    return port if is_local_host(host) else None


def is_local_host(host: str) -> bool:
    """Whether a host name or address is this machine: loopback, or an address we can bind to."""
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        ip = str(addr[0]).split("%")[0]
        try:
            if ipaddress.ip_address(ip).is_loopback or ipaddress.ip_address(ip).is_unspecified:
                return True
        except ValueError:
            continue
        try:  # only an address of one of this machine's interfaces can be bound
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((ip, 0))
            return True
        except OSError:
            continue
    return False
