"""The fake driver's calibration kernels: tools/fake_driver.py's FakeDriver emulates the device
check's hand-written calibration kernels (tools/gpu_check/ptx/calibrate*.ptx) by entry name.

What a kernel writes is written (the pointer chain, the address a chase ends on, the per-CTA
records), from its parameters decoded with calibration_lab.KERNELS; what it takes is a duration
from the FAKE_* figures, on a virtual clock per stream: while a stream's emulated work runs, work
enqueued on it starts after it, and its timing events and the kernels' %globaltimer read that
clock; a host that waits for the stream (a query that finds it idle, a synchronize) sees that
time pass, and the host time an emulation takes (a chase follows its chain in Python) is hidden
from the device's clock.  So a dry run's calibration measures exactly the FAKE_* figures — round
numbers, plainly no GPU's — through the same buffers, graphs, events and records as a GPU's run.
The fake device is small (FAKE_SMS, FAKE_L2_BYTES) so that the buffers sized from its L2 stay
small on a CPU.  Without a calibration kernel nothing changes: every stream's clock is the host's.
"""
from __future__ import annotations

import ctypes
import functools
import time

import numpy as np

from tools.gpu_check.calibration_lab import (CTA_RECORD, FMA_PER_ITER, KERNELS, LINE,
                                             STREAM_UNROLL, STREAM_VECTOR)

FAKE_SMS = 4                           # small: the calibration's grids are a few CTAs per SM
FAKE_L2_BYTES = 1 << 20                # small: its HBM buffer is 32 L2s, 32 MiB here
FAKE_CLOCK_HZ = 1.0e9                  # %clock64 ticks once per ns of %globaltimer
FAKE_L2_BW = 2.0e12                    # bytes/s read from a footprint within L2 ...
FAKE_HBM_BW = 1.0e12                   # ... and beyond it
FAKE_L2_LATENCY_NS = 200               # one dependent load whose chain fits L2 ...
FAKE_HBM_LATENCY_NS = 500              # ... and one whose chain does not
FAKE_LOADED = 2.0                      # either, beside a kernel still running on another stream
FAKE_LAUNCH_NS = 2000                  # an empty kernel in a graph, full edge ...
FAKE_LAUNCH_PDL_NS = 1000              # ... and programmatic edge
FAKE_FMA_CYCLES = 4                    # a dependent FMA; independent ones issue one per cycle
SHARED_RESERVED = 1024                 # per block beside its shared memory (the SM's total)
CTYPES = {"ptr": ctypes.c_uint64, "u64": ctypes.c_uint64, "u32": ctypes.c_uint32,
          "f32": ctypes.c_float}
# the bindings' names the calibration reads, as FakeDriver's attribute namespaces spell them
DEVICE_ATTRIBUTES = {"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": "sms",
                     "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE": "l2",
                     "CU_DEVICE_ATTRIBUTE_CLOCK_RATE": "clock",
                     "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": "smem_sm"}
CARVEOUT = 9                           # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
FUNCTION_ATTRIBUTES = {"CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT": CARVEOUT}


class FakeCalibration:
    """FakeDriver's calibration kernels and its virtual clock (a mixin ahead of its other
    parts: the calls below add to theirs).  `sms` and `l2_bytes` are the device's (an instance
    may set its own); the state is made on first use."""

    CALIBRATION = frozenset(KERNELS)
    sms, l2_bytes = FAKE_SMS, FAKE_L2_BYTES
    hidden_ns = 0                  # host time spent emulating kernels: not device time
    frozen_ns = None               # the device's "now" during one emulation
    graph_stream = None            # the stream a graph launch runs its nodes for

    @property
    def stream_clock(self) -> dict:
        """stream -> perf_counter ns its emulated work ends at."""
        return self.__dict__.setdefault("_stream_clock", {})

    @property
    def carveouts(self) -> dict:
        """function -> its preferred shared memory carveout (%)."""
        return self.__dict__.setdefault("_carveouts", {})

    # ---- the calls the calibration adds to
    def cuDeviceGetAttribute(self, attr, dev):
        extra = {"sms": self.sms, "l2": self.l2_bytes, "clock": int(FAKE_CLOCK_HZ / 1e3)}
        if attr == "smem_sm":
            return (0, self.shared_optin + SHARED_RESERVED)
        return (0, extra[attr]) if attr in extra else super().cuDeviceGetAttribute(attr, dev)

    def cuFuncSetAttribute(self, f, attr, value):
        if attr != CARVEOUT:
            return super().cuFuncSetAttribute(f, attr, value)
        if not -1 <= value <= 100:
            return (1,)                                     # CUDA_ERROR_INVALID_VALUE
        self.carveouts[f] = value
        return (0,)

    def cuStreamQuery(self, s):
        ret = super().cuStreamQuery(s)
        if int(ret[0]) == 0:                                # idle: the host saw it finish
            self.host_waits(self.stream_clock.get(s, 0))
        return ret

    def cuStreamSynchronize(self, s):
        ret = super().cuStreamSynchronize(s)
        self.host_waits(self.stream_clock.get(s, 0))
        return ret

    def cuEventSynchronize(self, event):
        ret = super().cuEventSynchronize(event)
        self.host_waits(self.events.get(event) or 0)
        return ret

    def cuStreamWaitEvent(self, stream, event, flags):
        """Outside capture the fake runs in order; the waiting stream's clock goes on from the
        event's too."""
        c = self.capturing
        ret = super().cuStreamWaitEvent(stream, event, flags)
        if (c is None or event not in c.events) and self.events.get(event) is not None:
            self.stream_clock[stream] = max(self.stream_clock.get(stream, 0), self.events[event])
        return ret

    def cuGraphLaunch(self, exec_, stream):
        self.graph_stream = stream      # its emulated kernels keep this stream busy
        try:
            return super().cuGraphLaunch(exec_, stream)
        finally:
            self.graph_stream = None

    def _op(self, fn, stream, launch=None, programmatic=False):
        """A calibration kernel's launch runs its emulation (now, or when its graph replays)."""
        if launch is not None and launch[0] in self.CALIBRATION:
            fn = functools.partial(self.calibration_kernel, launch[0], launch, stream, programmatic)
        return super()._op(fn, stream, launch, programmatic)

    # ---- the virtual clock
    def device_now(self, stream) -> int:
        """When work enqueued on `stream` now would start: the host's clock (perf_counter ns,
        less the host time the emulations took) or later while the stream's emulated work
        runs."""
        host = self.frozen_ns if self.frozen_ns is not None else (time.perf_counter_ns()
                                                                  - self.hidden_ns)
        return max(host, self.stream_clock.get(stream, 0))

    def host_waits(self, until_ns: int) -> None:
        """The host saw the device reach `until_ns`: its clock is at least that late from now on,
        as a host's that waited for a GPU's work."""
        lag = until_ns - (time.perf_counter_ns() - self.hidden_ns)
        if lag > 0:
            self.hidden_ns -= lag

    def _busy(self, stream, ns: float) -> tuple[int, int]:
        """`ns` of emulated work on `stream` (a graph's nodes: the stream it is launched into):
        its (start, end)."""
        s = stream if self.graph_stream is None else self.graph_stream
        start = self.device_now(s)
        self.stream_clock[s] = end = start + int(ns)
        return start, end

    # ---- the kernels
    def calibration_kernel(self, f, record, stream, programmatic) -> None:
        """One launch, emulated at the instant it was reached: the host time its emulation
        takes is hidden from the device's clock."""
        t = time.perf_counter_ns()
        self.frozen_ns = t - self.hidden_ns
        try:
            types, threads = KERNELS[f]
            ptrs = (ctypes.c_void_p * max(len(types), 1)).from_address(record[4])
            args = [CTYPES[k].from_address(ptrs[i]).value for i, k in enumerate(types)]
            grid = record[1][0] * record[1][1] * record[1][2]
            if f in ("calibrate_empty", "calibrate_empty_pdl"):
                self._busy(stream, FAKE_LAUNCH_PDL_NS if programmatic else FAKE_LAUNCH_NS)
            elif f.startswith("calibrate_fma"):
                self._fma(stream, grid, f == "calibrate_fma_wide", *args)
            else:
                getattr(self, "_" + f)(stream, grid, threads, *args)
        finally:
            self.frozen_ns = None
            self.hidden_ns += time.perf_counter_ns() - t

    def _span(self, device_ptr: int, nbytes: int) -> int:
        """The host address of nbytes of device memory, all inside one allocation."""
        for base, buf in self.allocations.items():
            if base <= device_ptr and device_ptr + nbytes <= base + ctypes.sizeof(buf):
                return device_ptr
        raise ValueError(f"fake device: {nbytes} bytes at {device_ptr:#x} overrun every "
                         "allocation")

    def _words(self, device_ptr: int, nbytes: int) -> np.ndarray:
        """A writable uint64 view of device memory."""
        return np.ctypeslib.as_array((ctypes.c_uint64 * (nbytes // 8)).from_address(
            self._span(device_ptr, nbytes)))

    def _calibrate_chain_init(self, stream, grid, threads, base, mask, mul, add) -> None:
        lines = mask + 1
        i = np.arange(lines, dtype=np.uint64)
        with np.errstate(over="ignore"):            # mod 2^64, as the kernel's mad.lo.u64
            following = (i * np.uint64(mul) + np.uint64(add)) & np.uint64(mask)
        self._words(base, lines * LINE)[::LINE // 8] = np.uint64(base) + following * np.uint64(LINE)
        self._busy(stream, lines * LINE / FAKE_HBM_BW * 1e9)

    def _calibrate_chase(self, stream, grid, threads, p, steps, delay, out) -> None:
        within_l2 = next(ctypes.sizeof(b) for a, b in self.allocations.items()
                         if a <= p < a + ctypes.sizeof(b)) <= self.l2_bytes
        for _ in range(steps):                      # the chain, followed for real
            p = ctypes.c_uint64.from_address(self._span(p, 8)).value
        s = stream if self.graph_stream is None else self.graph_stream
        start = self.device_now(s)
        loaded = any(t > start for k, t in self.stream_clock.items() if k != s)
        step = ((FAKE_L2_LATENCY_NS if within_l2 else FAKE_HBM_LATENCY_NS)
                * (FAKE_LOADED if loaded else 1.0))
        self._busy(stream, delay + steps * step)
        t0 = start + delay
        t1 = t0 + int(steps * step)
        cycles = FAKE_CLOCK_HZ / 1e9
        self._words(out, 40)[:] = [t0, t1, int(t0 * cycles), int(t1 * cycles), p]

    def _calibrate_stream_read(self, stream, grid, threads, base, iters, passes, records) -> None:
        footprint = iters * STREAM_UNROLL * grid * threads * STREAM_VECTOR
        self._span(base, footprint)                 # what it would read lies in its buffer
        bw = FAKE_L2_BW if footprint <= self.l2_bytes else FAKE_HBM_BW
        start, end = self._busy(stream, passes * footprint / bw * 1e9)
        rec = self._words(records, CTA_RECORD * grid).reshape(grid, CTA_RECORD // 8)
        rec[:, 0], rec[:, 1] = start, end

    def _fma(self, stream, grid, wide, iters, a, b, records) -> None:
        """Dependent FMAs overlap fully beside another CTA; independent ones take turns."""
        per_sm = -(-grid // self.sms)
        cycles = iters * FMA_PER_ITER * (per_sm if wide else FAKE_FMA_CYCLES)
        start, end = self._busy(stream, cycles / FAKE_CLOCK_HZ * 1e9)
        rec = self._words(records, CTA_RECORD * grid).reshape(grid, CTA_RECORD // 8)
        rec[:, 0] = np.arange(grid, dtype=np.uint64) % np.uint64(self.sms)  # %smid, guard 0
        rec[:, 1], rec[:, 2], rec[:, 3] = cycles, start, end
