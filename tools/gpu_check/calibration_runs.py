"""The calibration's experiments on the device (tools/gpu_check/calibrate.py orders them).

  Streamer          a buffer read pass after pass by every SM (calibrate_stream_read): its read
                    bandwidth, and the load beside a loaded chase
  Chain             a pointer chain (calibrate_chain_init) and its chases (calibrate_chase): ns and
                    cycles per dependent load, where each chase ended, inside a stream's window
  launch cost       graphs of empty kernels on full and programmatic edges (calibrate_empty_pdl)
  co-resident CTAs  the FMA kernels one, then two per SM (calibrate_fma_chain, _wide)

Each returns plain figures (seconds, bytes, cycles, ns) for calibration_model.py to set beside
the cost model's inputs.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter

import numpy as np

from coppelius.driver.calls import check, cu
from coppelius.driver.module import Kernel
from coppelius.driver.stream import Event, Graph, Stream, elapsed_ms

from tools.gpu_check.calibration_lab import (CHAIN_ADD, CHAIN_MUL, CHASE_RECORD, CTA_RECORD,
                                             FMA_PER_ITER, KERNELS, LINE, PDL_ENTRY,
                                             STREAM_CTAS_PER_SM, STREAM_UNROLL, STREAM_VECTOR,
                                             CalibrationTimeout, Lab, chain_walk)

TARGET_S = 1e-3             # each timed launch: launch cost and clock resolution well under 1%
MAX_PASSES = 1 << 14        # a stream's passes at most (a stand-in driver times nothing)
PROBE_FRACTION = 0.25       # the probe grows its launch until it lasts this much of TARGET_S ...
PROBE_GROWTH = 2.0          # ... aiming past it (each probe's time also holds launch overhead)
GRAPH_LAUNCHES = 200        # empty kernels in the launch-cost graph ...
GRAPH_LAUNCHES_SHORT = 20   # ... and in the short one: the slope drops the graph's own cost
GRAPH_LEAD = 2              # replays queued ahead of a timed one: the host's enqueue not in it
FMA_ITERS = 1 << 16         # ≈ 1 ms for the dependent chain at 4 cycles an FMA, 2 GHz
FMA_A, FMA_B = 0.999, 1e-3  # the FMA's constants: x stays finite over any number of steps
CARVEOUT_MAX_SHARED = 100   # the preferred carveout, percent: all of L1 as shared memory


def _r(x, digits: int = 6):
    return None if x is None else float(f"{x:.{digits}g}")


# ---------------------------------------------------------------- bandwidth

def stream_shape(lab: Lab) -> tuple[int, int]:
    """(CTAs, bytes one iteration of the whole grid reads) of calibrate_stream_read."""
    ctas = STREAM_CTAS_PER_SM * lab.sms
    return ctas, ctas * KERNELS["calibrate_stream_read"][1] * STREAM_VECTOR * STREAM_UNROLL


class Streamer:
    """A buffer read by calibrate_stream_read: `iters` iterations a pass (its footprint)."""

    def __init__(self, lab: Lab, want_bytes: float):
        self.lab = lab
        self.ctas, per_iter = stream_shape(lab)
        self.iters = max(1, int(want_bytes // per_iter))
        self.footprint = self.iters * per_iter
        self.buffer = lab.buffer(self.footprint)
        self.pass_s: float | None = None            # one pass's time, from the probe
        self.passes = 1                             # a launch beside a loaded chase: its passes

    def launch(self, passes: int, stream: Stream | None = None) -> None:
        self.lab.launch("calibrate_stream_read", self.ctas,
                        [self.buffer.ptr, self.iters, passes, self.lab.records.ptr], stream)

    def passes_for(self, seconds: float) -> int:
        return int(min(max(math.ceil(seconds / self.pass_s), 1), MAX_PASSES))

    def window(self) -> tuple[int, int]:
        """The last launch's [first CTA start, last CTA end] (%globaltimer ns)."""
        rec = self.lab.read(self.lab.records, CTA_RECORD * self.ctas).view(np.uint64)
        rec = rec.reshape(self.ctas, CTA_RECORD // 8)
        return int(rec[:, 0].min()), int(rec[:, 1].max())

    def probe(self) -> None:
        """One pass's time, from launches of ever more passes until one lasts PROBE_FRACTION of
        TARGET_S (a launch's own cost then a small part of it)."""
        passes = 1
        while True:
            t = self.lab.timed(lambda: self.launch(passes), 1)[0]
            self.pass_s = max(t, 1e-9) / passes
            if t >= PROBE_FRACTION * TARGET_S or passes >= MAX_PASSES:
                return
            passes = self.passes_for(PROBE_FRACTION * TARGET_S * PROBE_GROWTH)

    def measure(self, repeats: int) -> dict:
        """Read bandwidth: the probe sizes the passes of the timed launches."""
        self.probe()
        passes = self.passes_for(TARGET_S)
        times = self.lab.timed(lambda: self.launch(passes), repeats)
        per = self.footprint * passes
        bw = [per / t if t > 0 else None for t in times]
        good = [b for b in bw if b]
        if good:
            self.pass_s = self.footprint / statistics.median(good)
        return {"footprint_bytes": self.footprint, "passes": passes, "ctas": self.ctas,
                "seconds": times, "bytes_per_s": statistics.median(good) if good else None}


# ---------------------------------------------------------------- dependent-load chains

class Chain:
    """A chain of `lines` 128-byte lines (a power of two) written by calibrate_chain_init."""

    def __init__(self, lab: Lab, lines: int):
        self.lab, self.lines, self.mask = lab, lines, lines - 1
        self.buffer = lab.buffer(lines * LINE)
        lab.launch("calibrate_chain_init", STREAM_CTAS_PER_SM * lab.sms,
                   [self.buffer.ptr, self.mask, CHAIN_MUL, CHAIN_ADD])
        self.cursor = 0                 # where the next fresh chase starts

    def address(self, line: int) -> int:
        return self.buffer.ptr + line * LINE

    def chase(self, start: int, steps: int, delay_ns: int = 0, beside=None) -> dict:
        """One chase of `steps` from line `start` (beside `beside`'s streaming grid, launched
        first on the side stream with enough passes to outlast it); its figures and whether it
        ended where the chain says."""
        lab = self.lab
        lab.clear(lab.chase_record, CHASE_RECORD)
        if beside is not None:
            ready = Event(timing=False)
            ready.record(lab.stream)            # the stream after what came before the chase
            lab.side.wait(ready)
            ready.close()
            beside.launch(beside.passes, lab.side)
        lab.launch("calibrate_chase", 1, [self.address(start), steps, delay_ns,
                                          lab.chase_record.ptr])
        lab.wait()
        t0, t1, c0, c1, end = (int(x) for x in lab.read(lab.chase_record, CHASE_RECORD)
                               .view(np.uint64))
        want = chain_walk(start, steps, self.mask)
        out = {"steps": steps, "ns": t1 - t0, "cycles": c1 - c0,
               "ns_per_step": (t1 - t0) / steps if steps else None,
               "cycles_per_step": (c1 - c0) / steps if steps else None,
               "clock_hz": (c1 - c0) / (t1 - t0) * 1e9 if t1 > t0 else None,
               "ended_on_chain": end == self.address(want), "end_line": want}
        if beside is not None:
            w0, w1 = beside.window()
            out.update(stream_window_ns=w1 - w0, inside_stream=w0 <= t0 and t1 <= w1)
        return out


def _median(rows: list, key: str):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def chase_series(chain: Chain, steps: int, repeats: int, fresh: bool, delay_ns: int = 0,
                 beside=None) -> dict:
    """`repeats` chases (after an untimed one over the same lines when not `fresh`: a warm
    chain); fresh: each from the line the last one ended on, so that every step is a line no
    chase touched before."""
    if not fresh:
        chain.chase(0, steps, delay_ns, beside)                 # warms the lines it reads
    rows = []
    for _ in range(repeats):
        start = chain.cursor if fresh else 0
        row = chain.chase(start, steps, delay_ns, beside)
        if fresh:
            chain.cursor = row["end_line"]
        rows.append(row)
    return {"steps": steps, "repeats": rows,
            "ns_per_step": _median(rows, "ns_per_step"),
            "cycles_per_step": _median(rows, "cycles_per_step"),
            "clock_hz": _median(rows, "clock_hz"),
            "ended_on_chain": all(r["ended_on_chain"] for r in rows),
            "inside_stream": (all(r["inside_stream"] for r in rows) if beside is not None
                              else None)}


# ---------------------------------------------------------------- launch cost

def chain_graph(lab: Lab, kernel: Kernel, n: int, programmatic: bool) -> Graph:
    """A graph of `n` launches of `kernel` on one stream, each edge to the one before
    programmatic or full, captured as host/backends/cuda/capture.py captures the plan's."""
    params = kernel.pack([])

    def record(stream):
        for i in range(n):
            kernel.launch(stream, (lab.sms, 1, 1), params, programmatic=programmatic and i > 0)
    graph = Graph(lab.stream, record)
    graph.params = params           # alive as long as the graph
    return graph


def time_graph(lab: Lab, graph: Graph, repeats: int) -> list:
    """(repeats,) seconds of one replay, each behind GRAPH_LEAD replays queued ahead, after one
    untimed repeat."""
    start, end = Event(), Event()
    out = []
    try:
        for r in range(repeats + 1):
            for _ in range(GRAPH_LEAD):
                graph.launch()
            start.record(lab.stream)
            graph.launch()
            end.record(lab.stream)
            lab.wait(lab.stream)
            if r:
                out.append(elapsed_ms(start, end) * 1e-3)
    finally:
        start.close()
        end.close()
    return out


def launch_cost(lab: Lab, kernel: Kernel, programmatic: bool, repeats: int) -> dict:
    medians = {}
    for n in (GRAPH_LAUNCHES_SHORT, GRAPH_LAUNCHES):
        graph = chain_graph(lab, kernel, n, programmatic)
        try:
            medians[n] = statistics.median(time_graph(lab, graph, repeats))
        finally:
            graph.close()
    long, short = medians[GRAPH_LAUNCHES], medians[GRAPH_LAUNCHES_SHORT]
    return {"kernel": kernel.name, "launches": GRAPH_LAUNCHES, "graph_s": _r(long, 6),
            "short_launches": GRAPH_LAUNCHES_SHORT, "short_graph_s": _r(short, 6),
            "per_launch_s": _r(long / GRAPH_LAUNCHES, 6),
            "slope_s": _r((long - short) / (GRAPH_LAUNCHES - GRAPH_LAUNCHES_SHORT), 6)}


def measure_launches(lab: Lab, repeats: int) -> dict:
    """Full edges, then programmatic ones (compute capability 9.0 and later), the same kernel:
    the one that starts as every sm_90a Triton kernel does, where it loads."""
    pdl = lab.kernels.get(PDL_ENTRY)
    out = {"full": launch_cost(lab, pdl or lab.kernels["calibrate_empty"], False, repeats)}
    if pdl is None:
        out["programmatic"] = None
        out["programmatic_unavailable"] = (f"compute capability {lab.cc // 10}.{lab.cc % 10}: no "
                                           "programmatic dependent launch")
        return out
    try:
        out["programmatic"] = launch_cost(lab, pdl, True, repeats)
        out["programmatic_unavailable"] = None
    except CalibrationTimeout:
        raise
    except Exception as e:      # the driver's refusal (the backend then captures every edge full)
        out["programmatic"] = None
        out["programmatic_unavailable"] = f"{type(e).__name__}: {e}"
    return out


# ---------------------------------------------------------------- co-resident CTAs

def coresident_shared(lab: Lab) -> dict:
    """CTAs per SM -> dynamic shared bytes per CTA that fit that many on an SM and no more: a
    (n + 1)-th share of the SM's shared memory, so that n + 1 CTAs with the 1 KB each reserves
    beside it (cc ≥ 8.0) overflow the SM while n fit."""
    return {per_sm: lab.smem_per_sm // (per_sm + 1) for per_sm in (1, 2)}


def fma_run(lab: Lab, kernel: Kernel, per_sm: int, repeats: int) -> dict:
    ctas = per_sm * lab.sms
    nbytes = CTA_RECORD * ctas
    lab.clear(lab.records, nbytes)
    times = lab.timed(lambda: lab.launch(kernel.name, ctas, [FMA_ITERS, FMA_A, FMA_B,
                                                             lab.records.ptr], kernel=kernel),
                      repeats)
    raw = lab.read(lab.records, nbytes)
    words = raw.view(np.uint64).reshape(ctas, CTA_RECORD // 8)
    smid = raw.view(np.uint32).reshape(ctas, CTA_RECORD // 4)[:, 0]
    per = Counter(Counter(int(s) for s in smid).values())          # CTAs on an SM -> SMs
    cycles = words[:, 1].astype(np.float64)
    return {"ctas": ctas, "shared_bytes": kernel.shared, "seconds": times,
            "s": statistics.median(times), "cycles": float(np.median(cycles)),
            "sms_by_ctas": {str(k): v for k, v in sorted(per.items())},
            "placed_as_asked": per == Counter({per_sm: lab.sms}),
            "together": bool(words[:, 2].max() < words[:, 3].min())}


def measure_overlap(lab: Lab, repeats: int) -> dict:
    d = cu()
    shared = coresident_shared(lab)
    out = {"shared_bytes": shared, "iterations": FMA_ITERS}
    for entry in ("calibrate_fma_chain", "calibrate_fma_wide"):
        base = lab.kernels[entry]
        check(d.cuFuncSetAttribute(
            base.function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            CARVEOUT_MAX_SHARED), f"cuFuncSetAttribute({entry}, carveout)")
        runs = {}
        for per_sm in (1, 2):
            k = Kernel(base.function, entry, list(KERNELS[entry][0]), KERNELS[entry][1],
                       shared[per_sm])
            k.opt_in_shared()
            runs[per_sm] = fma_run(lab, k, per_sm, repeats)
        one, two = runs[1], runs[2]
        out[entry] = {"one_per_sm": one, "two_per_sm": two,
                      "ratio": two["s"] / one["s"] if one["s"] > 0 else None,
                      "cycles_ratio": two["cycles"] / one["cycles"] if one["cycles"] > 0 else None}
    chain = out["calibrate_fma_chain"]["one_per_sm"]["cycles"]
    out["cycles_per_dependent_fma"] = chain / (FMA_ITERS * FMA_PER_ITER) if chain > 0 else None
    return out
