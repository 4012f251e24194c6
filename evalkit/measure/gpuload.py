"""The GPU's side of the machine's load, through NVML (`pynvml`, shipped as `nvidia-ml-py`) where
it is installed and a driver answers: how far the SM clock sits below its maximum, which
clock-slowing throttle reasons are active, temperature, power, and processes on the devices that
are neither evalkit's nor the variants' servers. Without NVML every measure is null, never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Throttle ("clocks event") reasons that slow the clocks because of the machine, not the workload:
# SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake. Idle and application-clock
# settings are left out: they are not load from elsewhere.
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
SLOWING_REASONS = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0

GPU_FIELDS = ("gpu_sm_clock_ratio", "gpu_throttle", "gpu_temp_c", "gpu_power_w", "gpu_foreign_procs")


def _nvml() -> Any | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed, or a broken install: no GPU measures
        return None
    return pynvml


class GpuReader:
    """Every device NVML sees, read at once: the slowest SM clock ratio, the throttle reasons of
    any device (OR), the hottest temperature, the summed power and the count of foreign processes.
    ``nvml``: the module (tests pass a fake); None imports pynvml if it is there."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml = nvml if nvml is not None else _nvml()
        self.handles: list[Any] = []
        if self.nvml is None:
            return
        try:
            self.nvml.nvmlInit()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver, no device: nulls
            self.nvml, self.handles = None, []

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _call(self, name: str, *args: Any) -> Any | None:
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - a query this device does not support: that measure is null
            return None

    def read(self, known: set[int]) -> dict[str, Any]:
        """One reading; ``known``: the PIDs of evalkit and the servers (the rest are foreign)."""
        out: dict[str, Any] = dict.fromkeys(GPU_FIELDS)
        if not self.handles:
            return out
        ratios, temps, powers, reasons = [], [], [], []
        foreign: set[int] = set()
        procs_read = False
        for h in self.handles:
            sm, top = self._call("nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM), \
                self._call("nvmlDeviceGetMaxClockInfo", h, NVML_CLOCK_SM)
            if sm is not None and top:
                ratios.append(sm / top)
            r = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)  # the newer name
            if r is None:
                r = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            if r is not None:
                reasons.append(int(r) & SLOWING_REASONS)
            if (t := self._call("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)) is not None:
                temps.append(float(t))
            if (p := self._call("nvmlDeviceGetPowerUsage", h)) is not None:
                powers.append(p / 1000.0)  # mW
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                procs = self._call(fn, h)
                if procs is not None:
                    procs_read = True
                    foreign |= {int(p.pid) for p in procs if int(p.pid) not in known}
        out["gpu_sm_clock_ratio"] = round(min(ratios), 4) if ratios else None
        out["gpu_throttle"] = _or(reasons) if reasons else None
        out["gpu_temp_c"] = max(temps) if temps else None
        out["gpu_power_w"] = round(sum(powers), 1) if powers else None
        out["gpu_foreign_procs"] = len(foreign) if procs_read else None
        return out

    def close(self) -> None:
        if self.handles:
            self._call("nvmlShutdown")
            self.handles = []


def _or(values: list[int]) -> int:
    out = 0
    for v in values:
        out |= v
    return out
