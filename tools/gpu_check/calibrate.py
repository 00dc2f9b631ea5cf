"""The device check's calibration: the cost model's inputs measured on the GPU itself.

  python -m tools.gpu_check.calibrate --json FILE [--fence-timeout S] [--repeats N]

Hand-written kernels (tools/gpu_check/ptx/calibrate.ptx, and calibrate_pdl.ptx on compute
capability 9.0) loaded through the driver's JIT as the backend loads its release kernels: no
Triton, no torch.  Each experiment sets its figure beside the input of tools/cost/inputs.py it
calibrates (optimistic / central / pessimistic, in the row's unit):

  L2 bandwidth      every SM's CTAs read a buffer of L2_FRACTION of the device's L2 with 128-bit
                    .cg loads, pass after pass: bytes / event time                    -> L2_BW
  HBM bandwidth     the same over HBM_FACTOR L2s (every pass misses L2): a sanity reference, reads
                    only (the model's figure is a device copy's read + write)        -> HBM_BW
  latency           a dependent-load chain (calibrate_chase: each load's address is the previous
                    load's value) through a chain of 128-byte lines in a congruential order no
                    prefetch follows: a warm chain of L2_CHAIN_DIVISOR-th of L2 (L2 hits), and
                    fresh lines of a chain HBM_CHAIN_FACTOR times L2 (each line's first touch
                    since the HBM stream evicted L2: a round trip to HBM); each unloaded, then
                    loaded: the chase's one CTA beside a streaming grid on every SM (the L2 chain
                    beside the L2 stream, the HBM chain beside the HBM stream), the chase inside
                    the stream's window checked from both kernels' %globaltimer.  ns per step from
                    %globaltimer; cycles from %clock64, so the SM clock too        -> L2_LATENCY,
                                                                                    HBM_LATENCY
  launch cost       a graph of GRAPH_LAUNCHES empty kernels (one CTA per SM) chained by full
                    edges, and the same chain with programmatic edges, captured as the backend
                    captures the plan's (cuLaunchKernelEx, programmatic stream serialization;
                    the kernel starts with griddepcontrol.wait as every sm_90a Triton kernel
                    does): graph time / launches, and the slope against a graph of
                    GRAPH_LAUNCHES_SHORT                                       -> LAUNCH, LAUNCH_PDL
  co-resident CTAs  a CTA of four warps doing an FMA loop: one CTA on each SM, then two on each
                    (dynamic shared memory reserved so that at most one, then at most two, fit an
                    SM; %smid per CTA checks it, their %globaltimer windows that the two ran
                    together): time ratio, 1.0 = the two overlap fully, 2.0 = they take turns.
                    A dependent chain (latency-bound) and eight independent chains (issue-bound);
                    the chain's cycles per FMA        -> DEP_OP_CYCLES, and sm_sim.py's sharing of
                                                         an SM (its ratio for these two kernels)

Every timed launch lasts about TARGET_S (its size from untimed probes), so a launch's own cost
and the clocks' resolution stay under 1%; REPEATS timed launches each, each behind an untimed
launch of the same, their median.  Every wait for the GPU is bounded by --fence-timeout; after a
timeout no further experiment runs and nothing is freed (the GPU may still touch it; process exit
frees it).  FILE gets the rows, each experiment's details, the checks the figures rest on and any
experiment's error; the exit status is 1 when an experiment failed.  The dry run runs this same
module on tools/fake_driver.py, which emulates each kernel by its entry name (plausible, plainly
fake figures on a small fake device).

  calibrate.py           this command: the experiments in order, the JSON, the exit status
  calibration_lab.py     the kernels' table and records, the device, bounded waits, event timing
  calibration_runs.py    the experiments on the device: streams, chases, launch graphs, FMA CTAs
  calibration_model.py   the figures beside tools/cost/inputs.py, and the checks they rest on
  fake_calibration.py    the fake driver's emulation of the kernels (tools/fake_driver.py)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from tools.gpu_check.calibration_lab import (LINE, CalibrationTimeout, Lab, pow2_ceil,
                                             pow2_floor)
from tools.gpu_check.calibration_model import checks, model_inputs, rows
from tools.gpu_check.calibration_runs import (Chain, Streamer, chase_series, measure_launches,
                                              measure_overlap)

L2_FRACTION = 0.4           # the L2 stream's footprint, at most: 24 MB of an H200's 60 MB,
#                             room left for the chains and whatever the driver keeps in L2
L2_FOOTPRINT_MAX = 0.5      # a footprint beyond this fraction of L2 is not an L2 figure
HBM_FACTOR = 32             # the HBM stream's buffer in L2s (≈ 2 GB on an H200): no pass hits L2
HBM_CHAIN_FACTOR = 4        # the HBM chase's chain: at least this many L2s (a power of two in lines)
L2_CHAIN_DIVISOR = 32       # the L2 chase's chain: at most this fraction of L2 (≈ 1 MB on an H200)
CHASE_STEPS_L2 = 4096       # ≈ 1 ms at the model's central L2_LATENCY
CHASE_STEPS_HBM = 2048      # ≈ 1.2 ms at its central HBM_LATENCY; fresh lines every step
LOADED_DELAY_NS = 20_000    # the loaded chase spins this long first: the stream is on every SM
LOADED_FACTOR = 8           # the stream beside a loaded chase lasts this many unloaded chases
REPEATS = 5                 # timed launches per figure (each behind an untimed lead)
GRAPH_REPEATS = 10          # replays timed per launch-cost graph, at least
FENCE_TIMEOUT_S = 20.0      # any wait for the GPU (the device check passes its own)


# ---------------------------------------------------------------- the experiments in order

def experiments(lab: Lab, repeats: int) -> list:
    """(name, function) in the order they run: the bandwidths first (their probes size the
    streams beside the loaded chases); the chains written, then one HBM pass evicts them from
    L2, so the HBM chases find none of their lines there; the unloaded chases before the loaded
    ones (the fake driver's emulation counts a chase as loaded while another stream is busy)."""
    state: dict = {}

    def bandwidth():
        hbm = state["hbm"] = Streamer(lab, HBM_FACTOR * lab.l2_bytes)
        l2 = state["l2"] = Streamer(lab, L2_FRACTION * lab.l2_bytes)
        out = {"hbm": hbm.measure(repeats), "l2": l2.measure(repeats)}
        out["l2"]["fits_l2"] = l2.footprint <= L2_FOOTPRINT_MAX * lab.l2_bytes
        if not out["l2"]["fits_l2"]:
            out["l2"]["bytes_per_s"] = None         # not an L2 figure on this device
        return out

    def chase():
        l2c = Chain(lab, max(pow2_floor(lab.l2_bytes // L2_CHAIN_DIVISOR // LINE), 1))
        hbmc = Chain(lab, pow2_ceil(HBM_CHAIN_FACTOR * lab.l2_bytes // LINE))
        lab.wait()
        state["hbm"].launch(1)              # evicts the chains' lines written just now
        lab.wait()
        out = {"l2_unloaded": chase_series(l2c, CHASE_STEPS_L2, repeats, fresh=False),
               "hbm_unloaded": chase_series(hbmc, CHASE_STEPS_HBM, repeats, fresh=True)}
        for key, chain, steps, stream in (("l2_loaded", l2c, CHASE_STEPS_L2, state["l2"]),
                                          ("hbm_loaded", hbmc, CHASE_STEPS_HBM, state["hbm"])):
            alone = out[key.replace("loaded", "unloaded")]["ns_per_step"] or 0.0
            stream.passes = stream.passes_for(
                LOADED_FACTOR * (LOADED_DELAY_NS + steps * alone) * 1e-9)
            out[key] = chase_series(chain, steps, repeats, fresh=chain is hbmc,
                                    delay_ns=LOADED_DELAY_NS, beside=stream)
            out[key]["stream_passes"] = stream.passes
        # a full-period chain repeats after `lines` steps: the HBM chases' lines all fresh so far
        walked = sum(len(out[k]["repeats"]) * CHASE_STEPS_HBM for k in ("hbm_unloaded",
                                                                          "hbm_loaded"))
        out["chains"] = {"l2_lines": l2c.lines, "hbm_lines": hbmc.lines, "line_bytes": LINE,
                         "hbm_steps": walked, "hbm_fresh": walked <= hbmc.lines}
        return out

    return [("bandwidth", bandwidth), ("chase", chase),
            ("launch", lambda: measure_launches(lab, max(repeats, GRAPH_REPEATS))),
            ("overlap", lambda: measure_overlap(lab, repeats))]


def calibrate(fence_timeout_s: float, repeats: int) -> dict:
    """Every experiment; an experiment that raises is recorded and the rest still run, unless
    the GPU stopped answering (a timeout: nothing more runs, nothing is freed)."""
    lab = Lab(fence_timeout_s)
    results: dict = {"errors": {}}
    hung = False
    try:
        results["device"] = lab.describe()
        for name, run in experiments(lab, repeats):
            if hung:
                results["errors"][name] = "not run: an earlier experiment timed out"
                continue
            t = time.perf_counter()
            try:
                results[name] = run()
            except CalibrationTimeout as e:
                hung = True
                results["errors"][name] = str(e)
            except Exception as e:
                results["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            results.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 3)
    finally:
        if not hung:
            lab.close()
    return results


def report(results: dict) -> dict:
    model, why = model_inputs()
    return {**results, "model_unavailable": why, "rows": rows(results, model),
            "checks": checks(results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="where the figures go")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed launches per figure")
    ap.add_argument("--fence-timeout", type=float, default=FENCE_TIMEOUT_S, metavar="S",
                    help="seconds any wait for the GPU may take")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    out = report(calibrate(a.fence_timeout, a.repeats))
    a.json.write_text(json.dumps(out, indent=1, default=str, ensure_ascii=False))
    for r in out["rows"]:
        print(f"{r['name']}: {r['measured']} {r['unit']} (model {r['optimistic']} / "
              f"{r['central']} / {r['pessimistic']})")
    for name, why in out["errors"].items():
        print(f"{name} FAILED: {why.splitlines()[0]}", file=sys.stderr)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
