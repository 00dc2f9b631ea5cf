"""Telemetry per GPU through NVIDIA's management library, by the nvidia-ml-py package (`pynvml`,
the optional extra `nvml`): temperature, power, SM and memory clocks, clock-throttle reasons,
volatile ECC error counts, pending retired pages and row remaps, at the start and the end of a
node run and every `interval_s` while it runs.  Without the package or the library, "telemetry
unavailable" and why: never a failure.  A reading a GPU does not support is null."""
from __future__ import annotations

import time

INTERVAL_S = 10.0                   # seconds between samples while the runs go on
MILLI = 1000.0                      # NVML reports power in milliwatts
UNAVAILABLE = "telemetry unavailable"


class Telemetry:
    """Samples for each GPU (by UUID, the identity CUDA and NVML share)."""

    def __init__(self, uuids: list[str], interval_s: float = INTERVAL_S):
        self.uuids, self.interval_s = uuids, interval_s
        self.samples = {u: [] for u in uuids}
        self.reason, self.nvml, self.handles, self.t0, self.last = None, None, {}, 0.0, 0.0
        self.closed = False
        if not any(uuids):
            self.reason = f"{UNAVAILABLE}: no GPU (the interpret backend)"
            return
        try:
            import pynvml
        except ImportError:
            self.reason = (f"{UNAVAILABLE}: nvidia-ml-py is not installed "
                           "(pip install 'coppelius[nvml]')")
            return
        try:
            pynvml.nvmlInit()
            self.handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u.encode()) for u in uuids}
        except pynvml.NVMLError as e:
            self.reason = f"{UNAVAILABLE}: NVML: {e}"
            return
        self.nvml = pynvml

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def sample(self, phase: str) -> None:
        if not self.available or self.closed:
            return
        now = time.monotonic()
        self.t0 = self.t0 or now
        self.last = now
        for u, h in self.handles.items():
            self.samples[u].append(dict(phase=phase, t_s=round(now - self.t0, 3),
                                        **self._read(h)))

    def tick(self) -> None:
        """While the runs go on: a sample when `interval_s` has passed since the last."""
        if not self.closed and self.available and time.monotonic() - self.last >= self.interval_s:
            self.sample("during")

    def close(self) -> None:
        if self.available and not self.closed:
            self.nvml.nvmlShutdown()
            self.closed = True

    def _read(self, h) -> dict:
        n = self.nvml
        c = self._call
        remap = c(n.nvmlDeviceGetRemappedRows, h)
        power = c(n.nvmlDeviceGetPowerUsage, h)
        return {
            "temperature_c": c(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "power_w": None if power is None else power / MILLI,
            "sm_clock_mhz": c(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "memory_clock_mhz": c(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "throttle_reasons": c(n.nvmlDeviceGetCurrentClocksEventReasons, h),
            "ecc_volatile_corrected": c(n.nvmlDeviceGetTotalEccErrors, h,
                                        n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            "ecc_volatile_uncorrected": c(n.nvmlDeviceGetTotalEccErrors, h,
                                          n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                          n.NVML_VOLATILE_ECC),
            "retired_pages_pending": c(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
            "row_remap_pending": None if remap is None else remap[2],
            "row_remap_failure": None if remap is None else remap[3],
        }

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError:         # not supported on this GPU, or not in this library
            return None

    def report(self) -> dict:
        return {"available": self.available, "reason": self.reason,
                "interval_s": self.interval_s}


def summary_line(samples: list[dict]) -> str:
    """One GPU's telemetry in a line: first → last of each reading."""
    if not samples:
        return "no samples"
    a, b = samples[0], samples[-1]

    def span(key, unit, fmt="{:g}"):
        x, y = a.get(key), b.get(key)
        if x is None and y is None:
            return None
        shown = fmt.format(x) if x == y else f"{fmt.format(x)}→{fmt.format(y)}"
        return f"{shown} {unit}"
    parts = [span("temperature_c", "°C"), span("power_w", "W", "{:.0f}"),
             span("sm_clock_mhz", "MHz SM"), span("memory_clock_mhz", "MHz mem")]
    worst = {k: max((s.get(k) or 0) for s in samples) for k in
             ("throttle_reasons", "ecc_volatile_corrected", "ecc_volatile_uncorrected",
              "retired_pages_pending", "row_remap_pending")}
    parts.append(f"throttle {worst['throttle_reasons']:#x}" if worst["throttle_reasons"]
                 else "throttle none")
    parts.append(f"ECC volatile {worst['ecc_volatile_corrected']}/"
                 f"{worst['ecc_volatile_uncorrected']} (corr./uncorr.)")
    parts.append(f"retired pages pending {'yes' if worst['retired_pages_pending'] else 'no'}, "
                 f"row remap pending {'yes' if worst['row_remap_pending'] else 'no'}")
    return ", ".join(p for p in parts if p)
