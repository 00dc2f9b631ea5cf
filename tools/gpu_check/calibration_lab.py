"""The calibration's kernels and the device they run on (tools/gpu_check/calibrate.py).

The hand-written PTX of tools/gpu_check/ptx/ and what the host must agree on with it: each entry's
parameters and threads per CTA (KERNELS, which tools/fake_driver.py decodes launches with too),
the records the kernels write, the pointer chain's step.  `Lab` is the device with its primary
context, a second stream, the kernels JIT-loaded as the backend loads its release kernels, a
mapped region to read records back through, and every wait for the GPU bounded.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from coppelius.driver.calls import check, cu
from coppelius.driver.device import Device, DeviceBuffer, MappedRegion, memcpy_dtoh, memset_d8
from coppelius.driver.module import Kernel, Module
from coppelius.driver.stream import Event, Stream, elapsed_ms

PTX_DIR = Path(__file__).resolve().parent / "ptx"
MODULE_PTX = PTX_DIR / "calibrate.ptx"              # .target sm_80: every device the backend runs
PDL_PTX = PTX_DIR / "calibrate_pdl.ptx"             # .target sm_90: griddepcontrol
PDL_CC = 90                                         # programmatic dependent launch from here on

# entry -> (its parameters as host/driver/module.py's Kernel packs them, threads per CTA): the
# .param lists and .reqntid of the PTX above (tools/fake_driver.py decodes launches with it)
KERNELS = {
    "calibrate_chain_init": (("ptr", "u64", "u64", "u64"), 256),
    "calibrate_chase": (("u64", "u32", "u64", "ptr"), 1),
    "calibrate_stream_read": (("ptr", "u32", "u32", "ptr"), 256),
    "calibrate_fma_chain": (("u32", "f32", "f32", "ptr"), 128),
    "calibrate_fma_wide": (("u32", "f32", "f32", "ptr"), 128),
    "calibrate_empty": ((), 128),
    "calibrate_empty_pdl": ((), 128),
}
PDL_ENTRY = "calibrate_empty_pdl"

LINE = 128                  # bytes per chain link: an L2 line, so that every step is its own line
CHAIN_MUL = 6364136223846793005     # Knuth's MMIX congruential multiplier (= 1 mod 4) and ...
CHAIN_ADD = 1442695040888963407     # ... increment (odd): one full cycle mod any power of two
CHASE_RECORD = 40           # calibrate_chase's record: t0, t1, c0, c1, the end address (u64 each)
CTA_RECORD = 32             # the per-CTA records of calibrate_stream_read and calibrate_fma_*
STREAM_VECTOR = 16          # bytes per load: ld.global.cg.v4.u32
STREAM_UNROLL = 4           # loads in flight per thread per iteration (calibrate_stream_read)
STREAM_CTAS_PER_SM = 4      # 4 × 256 threads: half an SM's threads, room for the chase's CTA
FMA_PER_ITER = 8            # FMAs a thread issues per iteration of calibrate_fma_chain / _wide
WIDE_CHAINS = 8             # calibrate_fma_wide's independent chains (calibrate_fma_chain: 1)
POLL_S = 1e-4               # a bounded wait's poll interval


class CalibrationTimeout(RuntimeError):
    """A wait for the GPU ran past the fence timeout: the GPU may be hung."""


def attribute(dev: Device, name: str) -> int:
    """One of the device's attributes (cuDeviceGetAttribute CU_DEVICE_ATTRIBUTE_<name>)."""
    d = cu()
    attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(check(d.cuDeviceGetAttribute(attr, dev.handle), f"cuDeviceGetAttribute({name})"))


def pow2_floor(n: int) -> int:
    return 1 << max(int(n).bit_length() - 1, 0)


def pow2_ceil(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def chain_next(line: int, mask: int) -> int:
    """The chain's next line after `line` (calibrate_chain_init's step)."""
    return (CHAIN_MUL * line + CHAIN_ADD) & mask


def chain_walk(line: int, steps: int, mask: int) -> int:
    for _ in range(steps):
        line = chain_next(line, mask)
    return line


class Lab:
    """The device, its two streams, the kernels, the buffers and a mapped readback region; every
    wait bounded by `fence_timeout_s`."""

    def __init__(self, fence_timeout_s: float):
        self.fence_timeout_s = fence_timeout_s
        self.closers: list = []
        self.dev = self.keep(Device())
        self.sms = attribute(self.dev, "MULTIPROCESSOR_COUNT")
        self.l2_bytes = attribute(self.dev, "L2_CACHE_SIZE")
        self.smem_per_sm = attribute(self.dev, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")
        try:                        # reported only, and deprecated: its absence costs nothing
            self.clock_khz = attribute(self.dev, "CLOCK_RATE")
        except Exception as e:
            self.clock_khz = f"{type(e).__name__}: {e}"
        self.cc = self.dev.compute_capability
        self.stream = self.dev.stream
        self.side = self.keep(Stream())             # the streaming grid beside a loaded chase
        self.kernels = self._load(MODULE_PTX, [e for e in KERNELS if e != PDL_ENTRY])
        if self.cc >= PDL_CC:
            self.kernels.update(self._load(PDL_PTX, [PDL_ENTRY], pdl=True))
        self.records = self.buffer(CTA_RECORD * STREAM_CTAS_PER_SM * self.sms)
        self.chase_record = self.buffer(CHASE_RECORD)
        self.readback = self.keep(MappedRegion(self.records.nbytes))

    def keep(self, x):
        """`x`, closed with the lab."""
        self.closers.append(x)
        return x

    def buffer(self, nbytes: int) -> DeviceBuffer:
        return self.keep(DeviceBuffer(nbytes))

    def _load(self, path: Path, entries: list, pdl: bool = False) -> dict:
        module = self.keep(Module(path.read_bytes(), str(path.relative_to(PTX_DIR.parents[2]))))
        return {e: Kernel(module.function(e), e, list(KERNELS[e][0]), KERNELS[e][1], 0, pdl=pdl)
                for e in entries}

    def close(self) -> None:
        for x in reversed(self.closers):
            x.close()
        self.closers = []

    def describe(self) -> dict:
        return {"name": self.dev.name, "cc": self.cc, "sms": self.sms, "l2_bytes": self.l2_bytes,
                "shared_per_sm": self.smem_per_sm, "clock_khz": self.clock_khz,
                "driver": self.dev.driver_version,
                "registers": {e: k.attributes.registers for e, k in self.kernels.items()}}

    # ---- launches, waits, timing
    def launch(self, entry: str, grid: int, values: list, stream: Stream | None = None,
               kernel: Kernel | None = None) -> None:
        k = kernel or self.kernels[entry]
        k.launch(stream or self.stream, (grid, 1, 1), k.pack(values))

    def wait(self, *streams: Stream) -> None:
        """Every stream (both by default) idle, or CalibrationTimeout after the fence timeout."""
        deadline = time.monotonic() + self.fence_timeout_s
        for s in streams or (self.stream, self.side):
            while not s.query():
                if time.monotonic() > deadline:
                    raise CalibrationTimeout(f"the GPU was still busy {self.fence_timeout_s:g} s "
                                             "after a calibration launch")
                time.sleep(POLL_S)

    def timed(self, enqueue, repeats: int) -> list:
        """(repeats,) seconds of what `enqueue()` puts on the main stream, between two events,
        each behind an untimed run of the same (the lead: the GPU is busy while the host records
        the start and enqueues, so neither the host nor the launch's latency is in the time)."""
        start, end = Event(), Event()
        out = []
        try:
            for _ in range(repeats):
                enqueue()
                start.record(self.stream)
                enqueue()
                end.record(self.stream)
                self.wait(self.stream)
                out.append(elapsed_ms(start, end) * 1e-3)
        finally:
            start.close()
            end.close()
        return out

    def read(self, buffer: DeviceBuffer, nbytes: int) -> np.ndarray:
        """`nbytes` of a device buffer, copied into the mapped region (uint8, a copy)."""
        memcpy_dtoh(self.readback.host_ptr, buffer.ptr, nbytes, self.stream)
        self.wait(self.stream)
        return self.readback.array[:nbytes].copy()

    def clear(self, buffer: DeviceBuffer, nbytes: int) -> None:
        memset_d8(buffer.ptr, 0, nbytes, self.stream)
