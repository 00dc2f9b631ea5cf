"""Telemetry per GPU through NVIDIA's management library, by the nvidia-ml-py package (`pynvml`,
the optional extra `nvml`): temperature, power, SM and memory clocks, clock-throttle reasons,
volatile ECC error counts, pending retired pages and row remaps.  `coppelius node` samples every
GPU at the start and the end of a node run and every `interval_s` while it runs; a run on the cuda
backend samples its own GPU when it starts, at each publication and at its end (the telemetry
file beside its result file: coppelius.results.telemetry_file).  Without the package or the
library, "telemetry unavailable" and why: never a failure.  A reading a GPU does not support is
null.

At the bottom of the layers: it imports only coppelius.extras (the install hint), so the run
and the node both use it."""
from __future__ import annotations

import time

from coppelius.extras import install_command

INTERVAL_S = 10.0                   # seconds between samples while a node's runs go on
MILLI = 1000.0                      # NVML reports power in milliwatts
UNAVAILABLE = "telemetry unavailable"
INSTALL_HINT = install_command("nvml")
# every reading a sample holds, in the order the node report and the telemetry file list them
READINGS = ("temperature_c", "power_w", "sm_clock_mhz", "memory_clock_mhz", "throttle_reasons",
            "ecc_volatile_corrected", "ecc_volatile_uncorrected", "retired_pages_pending",
            "row_remap_pending", "row_remap_failure")
# the counters summary_line reports at their worst over the samples
WORST = ("throttle_reasons", "ecc_volatile_corrected", "ecc_volatile_uncorrected",
         "retired_pages_pending", "row_remap_pending")
# NVML renamed "clocks throttle reasons" to "clocks event reasons" (nvidia-ml-py 12.535): the
# new name first, the old one where an older package lacks it
THROTTLE_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons",
                  "nvmlDeviceGetCurrentClocksThrottleReasons")


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
            self.reason = f"{UNAVAILABLE}: nvidia-ml-py is not installed ({INSTALL_HINT})"
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:      # NVMLError (no library, no driver), or a broken package
            self.reason = f"{UNAVAILABLE}: NVML: {e}"
            return
        for u in uuids:
            try:
                self.handles[u] = pynvml.nvmlDeviceGetHandleByUUID(u.encode())
            except Exception as e:
                self.reason = f"{UNAVAILABLE}: NVML does not know GPU {u} ({e})"
                self.handles = {}
                pynvml.nvmlShutdown()
                return
        self.nvml = pynvml

    @property
    def available(self) -> bool:
        return self.nvml is not None and not self.closed

    def read(self) -> dict[str, dict]:
        """Every GPU's readings now, by UUID (empty when telemetry is unavailable)."""
        if not self.available:
            return {}
        return {u: self._read(h) for u, h in self.handles.items()}

    def sample(self, phase: str) -> None:
        """One sample of every GPU, kept in `samples` with its phase and the seconds since the
        first sample."""
        if not self.available:
            return
        now = time.monotonic()
        self.t0 = self.t0 or now
        self.last = now
        for u, readings in self.read().items():
            self.samples[u].append(dict(phase=phase, t_s=round(now - self.t0, 3), **readings))

    def tick(self) -> None:
        """While the runs go on: a sample when `interval_s` has passed since the last."""
        if self.available and time.monotonic() - self.last >= self.interval_s:
            self.sample("during")

    def close(self) -> None:
        if self.available:
            self.closed = True
            try:
                self.nvml.nvmlShutdown()
            except Exception:       # the samples are taken; a failing shutdown loses nothing
                pass

    def _read(self, h) -> dict:
        n = self.nvml
        c = self._call
        remap = c("nvmlDeviceGetRemappedRows", h)
        power = c("nvmlDeviceGetPowerUsage", h)
        throttle = None
        for name in THROTTLE_CALLS:
            throttle = c(name, h)
            if throttle is not None:
                break
        return {
            "temperature_c": c("nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU),
            "power_w": None if power is None else power / MILLI,
            "sm_clock_mhz": c("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM),
            "memory_clock_mhz": c("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_MEM),
            "throttle_reasons": throttle,
            "ecc_volatile_corrected": c("nvmlDeviceGetTotalEccErrors", h,
                                        n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            "ecc_volatile_uncorrected": c("nvmlDeviceGetTotalEccErrors", h,
                                          n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                          n.NVML_VOLATILE_ECC),
            "retired_pages_pending": c("nvmlDeviceGetRetiredPagesPendingStatus", h),
            "row_remap_pending": None if remap is None else remap[2],
            "row_remap_failure": None if remap is None else remap[3],
        }

    def _call(self, name: str, *args):
        fn = getattr(self.nvml, name, None)
        if fn is None:                      # not in this nvidia-ml-py
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError:         # not supported on this GPU, or not in this library
            return None

    def report(self) -> dict:
        return {"available": self.nvml is not None, "reason": self.reason,
                "interval_s": self.interval_s}


def summary_line(samples: list[dict]) -> str:
    """One GPU's telemetry in a line: first → last of each reading, the worst of each counter."""
    if not samples:
        return "no samples"
    a, b = samples[0], samples[-1]

    def span(key, unit, fmt="{:g}"):
        x, y = a.get(key), b.get(key)
        if x is None and y is None:
            return None
        shown = [("—" if v is None else fmt.format(v)) for v in (x, y)]
        return f"{shown[0] if x == y else '→'.join(shown)} {unit}"
    parts = [span("temperature_c", "°C"), span("power_w", "W", "{:.0f}"),
             span("sm_clock_mhz", "MHz SM"), span("memory_clock_mhz", "MHz mem")]
    worst = {k: max((s.get(k) or 0) for s in samples) for k in WORST}
    parts.append(f"throttle {worst['throttle_reasons']:#x}" if worst["throttle_reasons"]
                 else "throttle none")
    parts.append(f"ECC volatile {worst['ecc_volatile_corrected']}/"
                 f"{worst['ecc_volatile_uncorrected']} (corr./uncorr.)")
    parts.append(f"retired pages pending {'yes' if worst['retired_pages_pending'] else 'no'}, "
                 f"row remap pending {'yes' if worst['row_remap_pending'] else 'no'}")
    return ", ".join(p for p in parts if p)
