"""The machine-load sampler's readers on fixture /proc trees (real-format snippets), the foreign-CPU
arithmetic, the listening-port -> PID lookup, NVML through a fake module, and one sampler reading
a fixture tree twice (issue 47)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from evalkit.measure.envload import EnvSampler, cpu_measures
from evalkit.measure.gpuload import GPU_FIELDS, GpuReader
from evalkit.measure.procfs import (
    CpuTimes,
    ProcFS,
    ProcStat,
    descendants,
    listening_inodes,
    local_port,
    parse_cpuinfo_mhz,
    parse_loadavg,
    parse_mem_available_mb,
    parse_per_cpu,
    parse_pid_stat,
    parse_proc_stat,
    parse_psi_some_avg10,
    sum_cpus,
)

# Real snippets (a 2-CPU machine), as the kernel writes them.
PROC_STAT = """cpu  18098 0 5352 53733 516 0 109 15 0 0
cpu0 2302 0 1039 35372 133 0 16 5 0 0
cpu1 15796 0 4313 18361 382 0 93 10 0 0
intr 1234567 0 9 0 0
ctxt 2345678
btime 1715241600
processes 7400
procs_running 2
procs_blocked 0
"""
PID_STAT_CAT = ("7327 (cat) R 7318 7318 4637 0 -1 4194304 101 0 0 0 0 0 0 0 20 0 1 0 39118 3133440 407 "
                "18446744073709551615 94384423981056 94384424000937 140722611462192 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0")
PID_STAT_ODD = ("4242 (tmux: srv) (x)) S 1 4242 4242 0 -1 4194560 2048 51 0 0 150 30 7 3 20 0 1 0 1200 "
                "9000000 900 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")
NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1343 1 0000000014bd3d14 100 0 0 10 0
   1: 0100007F:84E1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11216 1 00000000bddda7b6 100 0 0 10 0
   3: 0100007F:D4B0 0100007F:851F 06 00000000:00000000 03:0000092C 00000000     0        0 0 3 00000000e496a833
   4: 0100007F:84E1 0100007F:D4B2 01 00000000:00000000 00:00000000 00000000     0        0 77777 1 0000000000000000 20 4 30 10 -1
"""
NET_TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue "
    "tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000  1000        0 55555 1 0000000000000000 100 0 0 10 0\n"
)
LOADAVG = "0.18 0.33 0.16 3/101 6591\n"
PSI = "some avg10=1.53 avg60=0.80 avg300=0.20 total=123456\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=2345\n"
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1024000 kB\nMemAvailable:    8192000 kB\nBuffers: 1 kB\n"
CPUINFO = "processor\t: 0\nmodel name\t: X\ncpu MHz\t\t: 2400.000\n\nprocessor\t: 1\ncpu MHz\t\t: 2600.000\n"


def pid_stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, comm: str = "python3") -> str:
    return (f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 2048 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 "
            "39118 3133440 407 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n")


@pytest.mark.parametrize("field,value", [("user", 18098), ("nice", 0), ("system", 5352), ("idle", 53733),
                                         ("iowait", 516), ("irq", 0), ("softirq", 109), ("steal", 15), ("n_cpus", 2),
                                         ("busy", 18098 + 5352), ("total", 18098 + 5352 + 53733 + 516 + 109 + 15)])
def test_proc_stat_cpu_line(field, value):
    assert getattr(parse_proc_stat(PROC_STAT), field) == value


@pytest.mark.parametrize("cpu,field,value", [(0, "user", 2302), (0, "idle", 35372), (1, "system", 4313),
                                             (1, "steal", 10), (1, "n_cpus", 1)])
def test_proc_stat_per_cpu_lines(cpu, field, value):
    assert getattr(parse_per_cpu(PROC_STAT)[cpu], field) == value


def test_a_set_of_cpus_sums_their_lines():
    both = sum_cpus(parse_per_cpu(PROC_STAT), {0, 1})
    assert (both.user, both.system, both.idle, both.n_cpus) == (2302 + 15796, 1039 + 4313, 35372 + 18361, 2)


def test_a_set_of_cpus_the_file_lacks_is_none():
    assert sum_cpus(parse_per_cpu(PROC_STAT), {7}) is None


def test_proc_stat_without_cpu_line_is_none():
    assert parse_proc_stat("intr 1 2 3\n") is None


@pytest.mark.parametrize("text,field,value", [
    (PID_STAT_CAT, "ppid", 7318), (PID_STAT_CAT, "ticks", 0),
    (PID_STAT_ODD, "ppid", 1), (PID_STAT_ODD, "utime", 150), (PID_STAT_ODD, "stime", 30),
    (PID_STAT_ODD, "cutime", 7), (PID_STAT_ODD, "cstime", 3), (PID_STAT_ODD, "ticks", 190),
])
def test_pid_stat_fields(text, field, value):
    assert getattr(parse_pid_stat(text), field) == value


@pytest.mark.parametrize("parse,text,value", [
    (parse_loadavg, LOADAVG, 0.18), (parse_loadavg, "", None),
    (parse_psi_some_avg10, PSI, 1.53), (parse_psi_some_avg10, "full avg10=2.00 avg60=0 avg300=0 total=1\n", None),
    (parse_mem_available_mb, MEMINFO, 8000.0), (parse_mem_available_mb, "MemTotal: 1 kB\n", None),
    (parse_cpuinfo_mhz, CPUINFO, 2500.0), (parse_cpuinfo_mhz, "processor\t: 0\n", None),
    (parse_pid_stat, "garbage", None),
])
def test_one_line_parsers(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("table,port,inodes", [
    (NET_TCP, 0x07E8, {1343}), (NET_TCP, 0x84E1, {11216}),  # the established socket on 0x84E1 is not a listener
    (NET_TCP, 0xD4B0, set()), (NET_TCP6, 8000, {55555}), (NET_TCP6, 8001, set()),
])
def test_listening_inodes(table, port, inodes):
    assert listening_inodes(table, port) == inodes


# --- foreign CPU arithmetic ---------------------------------------------------------------------

CPU0 = CpuTimes(user=1000, nice=0, system=0, idle=1000, iowait=0, irq=0, softirq=0, steal=0, n_cpus=2)
# 100 ticks on each of 2 CPUs: 160 busy (1.6 cores), 30 idle, 6 iowait, 4 steal
CPU1 = CpuTimes(user=1120, nice=0, system=40, idle=1030, iowait=6, irq=0, softirq=0, steal=4, n_cpus=2)


def ps(ppid: int, utime: int, cutime: int = 0) -> ProcStat:
    return ProcStat(ppid=ppid, utime=utime, stime=0, cutime=cutime, cstime=0)


PREV = {10: ps(1, 100), 11: ps(10, 50), 20: ps(1, 1000), 30: ps(1, 7), 40: ps(1, 5000)}
NOW = {10: ps(1, 130), 11: ps(10, 70), 20: ps(1, 1040), 30: ps(1, 77), 40: ps(1, 5010)}


@pytest.mark.parametrize("field,value", [("busy_cpu", 1.6), ("own_cpu", 0.5), ("server_cpu", 0.4),
                                         ("foreign_cpu", 0.7), ("steal", 0.02), ("iowait", 0.03)])
def test_known_trees_are_subtracted(field, value):
    m = cpu_measures(CPU0, CPU1, PREV, NOW, {10, 11, 20}, {10, 11, 20}, {20})
    assert m[field] == pytest.approx(value)


def test_foreign_cpu_is_clamped_at_zero():
    busy_server = {**NOW, 20: ps(1, 1300)}  # the server's tree used more than the machine counted busy
    assert cpu_measures(CPU0, CPU1, PREV, busy_server, {10, 11, 20}, {10, 11, 20}, {20})["foreign_cpu"] == 0.0


def test_a_process_born_in_the_interval_counts_from_zero():
    now = {**NOW, 12: ps(10, 10)}
    assert cpu_measures(CPU0, CPU1, PREV, now, {10, 11}, {10, 11, 12}, set())["own_cpu"] == pytest.approx(0.6)


def test_a_process_joining_the_known_set_counts_only_its_growth():
    # pid 40 ran for ages before its port was found: 10 ticks of this interval, not its 5010
    assert cpu_measures(CPU0, CPU1, PREV, NOW, set(), {40}, {40})["server_cpu"] == pytest.approx(0.1)


def test_a_reaped_child_counts_its_last_interval_only():
    # child 11 (50 ticks when last seen) ended at 60; its parent's cutime grew by those 60
    now = {10: ps(1, 110, cutime=60), 20: NOW[20], 30: NOW[30], 40: NOW[40]}
    assert cpu_measures(CPU0, CPU1, PREV, now, {10, 11}, {10}, set())["own_cpu"] == pytest.approx(0.2)


@pytest.mark.parametrize("prev,now", [(None, CPU1), (CPU0, None), (CPU1, CPU1)])
def test_no_interval_gives_nulls(prev, now):
    assert cpu_measures(prev, now, PREV, NOW, set(), set(), set())["foreign_cpu"] is None


def test_descendants_follow_the_tree():
    procs = {1: ps(0, 0), 10: ps(1, 0), 11: ps(10, 0), 12: ps(11, 0), 13: ps(1, 0)}
    assert descendants(procs, [10, 99]) == {10, 11, 12}


# --- fixture /proc trees ------------------------------------------------------------------------


def write_tree(root: Path, stat: str, pids: dict[int, str], fds: dict[int, dict[str, str]] | None = None) -> None:
    for rel, text in {"proc/stat": stat, "proc/loadavg": LOADAVG, "proc/pressure/memory": PSI,
                      "proc/meminfo": MEMINFO, "proc/cpuinfo": CPUINFO, "proc/net/tcp": NET_TCP,
                      "proc/net/tcp6": NET_TCP6}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for pid, text in pids.items():
        (root / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / "proc" / str(pid) / "stat").write_text(text)
    for pid, links in (fds or {}).items():
        d = root / "proc" / str(pid) / "fd"
        d.mkdir(parents=True, exist_ok=True)
        for fd, target in links.items():
            if not (d / fd).is_symlink():
                (d / fd).symlink_to(target)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_tree(tmp_path, PROC_STAT, {100: pid_stat(100, 1, 5, 5), 101: pid_stat(101, 1, 0, 0),
                                     102: pid_stat(102, 1, 0, 0), 103: pid_stat(103, 1, 0, 0)},
               {100: {"0": "/dev/null", "3": "socket:[11216]"}, 101: {"0": "/dev/null"},
                102: {"5": "socket:[999]"}, 103: {"7": "socket:[55555]"}})
    return tmp_path


@pytest.mark.parametrize("port,pids", [(0x84E1, {100}), (8000, {103}), (0x07E8, set()), (12345, set())])
def test_the_pid_listening_on_a_port(tree, port, pids):
    assert ProcFS(tree).listeners(port) == pids


@pytest.mark.parametrize("reader,value", [("load1", 0.18), ("mem_pressure", 1.53), ("mem_available_mb", 8000.0),
                                          ("cpu_mhz", 2500.0)])
def test_host_readers_on_a_fixture_tree(tree, reader, value):
    assert getattr(ProcFS(tree), reader)() == value


def test_cpufreq_wins_over_cpuinfo(tree):
    for cpu, khz in (("cpu0", "3000000"), ("cpu1", "2000000")):
        p = tree / "sys/devices/system/cpu" / cpu / "cpufreq/scaling_cur_freq"
        p.parent.mkdir(parents=True)
        p.write_text(khz + "\n")
    assert ProcFS(tree).cpu_mhz() == 2000.0 + 500.0


@pytest.mark.parametrize("reader", ["load1", "mem_pressure", "mem_available_mb", "cpu_mhz", "cpu_times"])
def test_a_missing_file_reads_as_null(tmp_path, reader):
    assert getattr(ProcFS(tmp_path), reader)() is None


@pytest.mark.parametrize("url,port", [("http://127.0.0.1:8000/v1", 8000), ("http://localhost:9000", 9000),
                                      ("http://[::1]:8001", 8001), ("http://203.0.113.5:8000", None)])
def test_which_endpoints_are_on_this_host(url, port):
    assert local_port(url) == port


# --- GPU through a fake NVML --------------------------------------------------------------------


def fake_nvml(**over) -> SimpleNamespace:
    calls = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlDeviceGetClockInfo": lambda h, c: 1200, "nvmlDeviceGetMaxClockInfo": lambda h, c: 1600,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x1 | 0x4 | 0x40,  # idle + power cap + HW thermal
        "nvmlDeviceGetTemperature": lambda h, s: 71, "nvmlDeviceGetPowerUsage": lambda h: 312500,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [SimpleNamespace(pid=7), SimpleNamespace(pid=8)],
    }
    calls.update(over)
    return SimpleNamespace(**calls)


@pytest.mark.parametrize("field,value", [("gpu_sm_clock_ratio", 0.75), ("gpu_throttle", 0x44), ("gpu_temp_c", 71.0),
                                         ("gpu_power_w", 312.5), ("gpu_foreign_procs", 1)])
def test_gpu_measures(field, value):
    assert GpuReader(fake_nvml()).read(known={7})[field] == value


def test_an_unsupported_gpu_query_nulls_that_measure_only():
    def unsupported(h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    m = GpuReader(fake_nvml(nvmlDeviceGetPowerUsage=unsupported)).read(known=set())
    assert (m["gpu_power_w"], m["gpu_temp_c"]) == (None, 71.0)


def test_no_driver_gives_nulls():
    def no_driver():
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    assert GpuReader(fake_nvml(nvmlInit=no_driver)).read(known=set()) == dict.fromkeys(GPU_FIELDS)


def test_no_pynvml_gives_nulls(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the import then fails
    assert GpuReader().read(known=set()) == dict.fromkeys(GPU_FIELDS)


# --- the sampler on a fixture tree --------------------------------------------------------------


def test_the_sampler_attributes_a_fixture_machine(tmp_path, db):
    # evalkit 10 (child 11), a launched server 20 (child 21), an endpoint server 100 found by its
    # port (child 105), a neighbour 30; 100 ticks per CPU elapse between the two readings.
    def state(stat: str, t: dict[int, int]) -> None:
        write_tree(tmp_path, stat, {10: pid_stat(10, 1, t[10], 0), 11: pid_stat(11, 10, t[11], 0),
                                    20: pid_stat(20, 10, t[20], 0), 21: pid_stat(21, 20, t[21], 0),
                                    100: pid_stat(100, 1, t[100], 0), 105: pid_stat(105, 100, t[105], 0),
                                    30: pid_stat(30, 1, t[30], 0)}, {100: {"3": "socket:[11216]"}})

    before = {10: 100, 11: 50, 20: 1000, 21: 10, 100: 0, 105: 0, 30: 0}
    state(PROC_STAT, before)
    gpu = GpuReader(fake_nvml())
    s = EnvSampler(db, "r1", epoch=0.0, known_pids=lambda: {"cand": [20]},
                   endpoints=lambda: {"base": ["http://127.0.0.1:34017"]}, root=tmp_path, own_pid=10, gpu=gpu)
    assert s.sample() is None  # the first reading only primes
    s.set_active(["base"])
    later = PROC_STAT.replace("cpu  18098 0 5352 53733 516 0 109 15", "cpu  18258 0 5352 53763 522 0 109 19")
    state(later, {10: 110, 11: 60, 20: 1030, 21: 20, 100: 20, 105: 10, 30: 70})
    row = s.sample()
    assert row is not None
    got = {k: row[k] for k in ("busy_cpu", "own_cpu", "server_cpu", "foreign_cpu", "steal", "iowait",
                               "variant_active", "load1", "gpu_foreign_procs")}
    assert got == {"busy_cpu": 1.6, "own_cpu": 0.2, "server_cpu": 0.7, "foreign_cpu": 0.7, "steal": 0.02,
                   "iowait": 0.03, "variant_active": "base", "load1": 0.18, "gpu_foreign_procs": 2}
    db.close()


def test_variant_active_names_every_variant_of_the_interval(tmp_path, db):
    write_tree(tmp_path, PROC_STAT, {})
    s = EnvSampler(db, "r1", epoch=0.0, root=tmp_path, own_pid=1, gpu=GpuReader(fake_nvml(nvmlInit=None)))
    s.sample()
    s.set_active(["base"])
    s.set_active(None)
    s.set_active(["cand"])
    seen = [s.sample()["variant_active"]]  # type: ignore[index]
    seen.append(s.sample()["variant_active"])  # type: ignore[index]
    s.set_active([])
    seen.append(s.sample()["variant_active"])  # type: ignore[index]
    seen.append(s.sample()["variant_active"])  # type: ignore[index]
    assert seen == ["base,cand", "cand", "cand", None]
    db.close()


# --- only the CPUs evalkit and the servers may run on -------------------------------------------


def _snap(per_cpu: dict[int, CpuTimes], cpus: set[int]):
    from evalkit.measure.envload import _Snap

    agg = sum_cpus(per_cpu, per_cpu)
    return _Snap(0.0, agg, {}, set(), set(), per_cpu, cpus)


def _one(busy: int, idle: int) -> CpuTimes:
    return CpuTimes(user=busy, nice=0, system=0, idle=idle, iowait=0, irq=0, softirq=0, steal=0, n_cpus=1)


# 4 CPUs: a neighbour spins on CPU 0 (100 of 100 ticks busy), the rest idle
PER_PREV = {c: _one(0, 0) for c in range(4)}
PER_NOW = {0: _one(100, 0), 1: _one(0, 100), 2: _one(0, 100), 3: _one(0, 100)}


@pytest.mark.parametrize("cpus,n,foreign", [({0, 1}, 2, 1.0), ({2, 3}, 2, 0.0), ({0, 1, 2, 3}, 4, 1.0), (set(), 4, 1.0)])
def test_cpu_figures_cover_the_cpus_the_run_may_use(cpus, n, foreign):
    prev, now = EnvSampler._cpu_pair(_snap(PER_PREV, cpus), _snap(PER_NOW, cpus))
    got = (now.n_cpus, cpu_measures(prev, now, {}, {}, set(), set(), set())["foreign_cpu"])
    assert got == (n, foreign)


def test_the_cpus_of_this_process_are_found():
    from evalkit.measure.procfs import affinity

    assert affinity([os.getpid()]) == os.sched_getaffinity(0)


def test_the_cpus_of_an_ended_process_are_skipped():
    from evalkit.measure.procfs import affinity

    assert affinity([2**22 + 12345]) == set()
