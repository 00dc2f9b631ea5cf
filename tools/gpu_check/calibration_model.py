"""The calibration's figures beside the cost model (tools/gpu_check/calibrate.py): the rows of
the report and the checks the figures rest on.  Plain Python over the experiments' results (no
driver call): each figure in its unit beside the optimistic, central and pessimistic value of the
tools/cost/inputs.py input it calibrates, read by name when the report is made.
"""
from __future__ import annotations

import statistics

from tools.gpu_check.calibration_lab import FMA_PER_ITER, WIDE_CHAINS
from tools.gpu_check.calibration_runs import GRAPH_LAUNCHES

GUARD = "(device-side)"     # marks a check that reads what the kernels wrote
WARP = 32                   # threads a warp: a sub-partition issues a warp's FMAs at once
SCENARIOS = ("optimistic", "central", "pessimistic")
CORESIDENT_SOURCE = (
    "tools/cost/sm_sim.py's sharing rule (CTAs on one SM run at full rate while the shares of the "
    "SM each keeps busy alone add up to at most one, else all slow by the sum) for two CTAs of "
    "this kernel, a CTA's share its FMA issue time over its time alone, from ALU_PER_CLK, "
    "SUBPARTITIONS and DEP_OP_CYCLES (optimistic / central / pessimistic)")

# row -> (the input of tools/cost/inputs.py, its unit, the factor from SI to the unit, how)
ROWS = {
    "L2 read bandwidth": ("L2_BW", "TB/s", 1e-12,
                          "every SM's CTAs re-reading an L2-resident buffer, .cg 128-bit loads"),
    "HBM read bandwidth": ("HBM_BW", "TB/s", 1e-12,
                           "the same over a buffer many times L2 (reads only: a sanity reference; "
                           "the model's figure is a device copy's read + write)"),
    "L2 hit latency, unloaded": ("L2_LATENCY", "µs", 1e6,
                                 "a dependent-load chain over a warm L2-resident chain, alone"),
    "L2 hit latency, loaded": ("L2_LATENCY", "µs", 1e6,
                               "the same beside a grid streaming from L2 on every SM"),
    "HBM latency, unloaded": ("HBM_LATENCY", "µs", 1e6,
                              "a dependent-load chain over lines not in L2, alone"),
    "HBM latency, loaded": ("HBM_LATENCY", "µs", 1e6,
                            "the same beside a grid streaming from HBM on every SM"),
    "launch in a graph, full edge": ("LAUNCH", "µs", 1e6,
                                     f"a graph of {GRAPH_LAUNCHES} empty one-CTA-per-SM kernels "
                                     "/ launches"),
    "launch in a graph, programmatic edge": ("LAUNCH_PDL", "µs", 1e6,
                                             "the same graph, every edge programmatic"),
    "dependent fp32 FMA": ("DEP_OP_CYCLES", "cycles", 1.0,
                           "%clock64 over a chain of dependent FMAs, one CTA per SM"),
    "two co-resident CTAs, latency-bound": ("SHARING_CHAIN", "×", 1.0,
                                            "time of two CTAs on each SM / one, four warps of "
                                            "dependent FMAs each"),
    "two co-resident CTAs, issue-bound": ("SHARING_WIDE", "×", 1.0,
                                          "the same, eight independent FMA chains a thread"),
    "SM clock": ("CLOCK_HZ", "GHz", 1e-9, "%clock64 / %globaltimer over the chases"),
}
# a row's input as the report shows it, where it is not one name of tools/cost/inputs.py
SHOWN = {"SHARING_CHAIN": "sm_sim.py sharing", "SHARING_WIDE": "sm_sim.py sharing"}
# the rows read from what the kernels recorded (%globaltimer, %clock64), not timed by events
RECORDED = frozenset({"L2 hit latency, unloaded", "L2 hit latency, loaded", "HBM latency, unloaded",
                      "HBM latency, loaded", "dependent fp32 FMA", "SM clock"})
RANGES = ("L2_BW", "HBM_BW", "L2_LATENCY", "HBM_LATENCY", "LAUNCH", "LAUNCH_PDL", "DEP_OP_CYCLES")


def sharing_ratio(dep_cycles: float, chains: int, warp_issue_per_cycle: float) -> float:
    """The model's time of two CTAs of calibrate_fma_* on one SM over one's: each thread's
    FMA_PER_ITER FMAs an iteration in `chains` independent chains, one warp per sub-partition;
    its share is their issue time over its time alone (a chain's FMAs DEP cycles apart), and two
    shares past one slow both by their sum (tools/cost/sm_sim.py)."""
    issue = FMA_PER_ITER / warp_issue_per_cycle
    alone = max(issue, FMA_PER_ITER / chains * dep_cycles)
    return max(1.0, 2 * issue / alone)


def model_inputs() -> tuple[dict, str | None]:
    """input -> (optimistic, central, pessimistic, source) from tools/cost/inputs.py (a single
    figure thrice where the model holds one), or ({}, why) when it cannot be read."""
    try:
        from tools.cost.inputs import (ALU_PER_CLK, CLOCK_HZ, DEP_OP_CYCLES, HBM_BW,
                                       HBM_LATENCY, L2_BW, L2_LATENCY, LAUNCH, LAUNCH_PDL,
                                       SUBPARTITIONS)
    except Exception as e:          # the model's inputs moved: the measurements still stand
        return {}, f"{type(e).__name__}: {e}"
    ranges = dict(zip(RANGES, (L2_BW, HBM_BW, L2_LATENCY, HBM_LATENCY, LAUNCH, LAUNCH_PDL,
                               DEP_OP_CYCLES)))
    out = {k: (r.optimistic, r.central, r.pessimistic, r.source) for k, r in ranges.items()}
    out["CLOCK_HZ"] = (CLOCK_HZ, CLOCK_HZ, CLOCK_HZ, "tools/cost/inputs.py CLOCK_HZ")
    per_cycle = ALU_PER_CLK / SUBPARTITIONS / WARP      # warp FMAs a sub-partition issues a cycle
    for key, chains in (("SHARING_CHAIN", 1), ("SHARING_WIDE", WIDE_CHAINS)):
        out[key] = tuple(sharing_ratio(DEP_OP_CYCLES[s], chains, per_cycle)
                         for s in SCENARIOS) + (CORESIDENT_SOURCE,)
    return out, None


def measured_si(results: dict) -> dict:
    """row -> the measured figure in SI units (B/s, s, cycles, ratio, Hz), None where absent."""
    bw = results.get("bandwidth") or {}
    ch = results.get("chase") or {}
    la = results.get("launch") or {}
    ov = results.get("overlap") or {}

    def ns(key):
        x = (ch.get(key) or {}).get("ns_per_step")
        return None if x is None else x * 1e-9

    def ratio(entry):
        return (ov.get(entry) or {}).get("ratio")
    clocks = [x["clock_hz"] for x in ch.values() if isinstance(x, dict) and x.get("clock_hz")]
    return {"L2 read bandwidth": (bw.get("l2") or {}).get("bytes_per_s"),
            "HBM read bandwidth": (bw.get("hbm") or {}).get("bytes_per_s"),
            "L2 hit latency, unloaded": ns("l2_unloaded"),
            "L2 hit latency, loaded": ns("l2_loaded"),
            "HBM latency, unloaded": ns("hbm_unloaded"),
            "HBM latency, loaded": ns("hbm_loaded"),
            "launch in a graph, full edge": (la.get("full") or {}).get("per_launch_s"),
            "launch in a graph, programmatic edge": (la.get("programmatic") or {}).get(
                "per_launch_s"),
            "dependent fp32 FMA": ov.get("cycles_per_dependent_fma"),
            "two co-resident CTAs, latency-bound": ratio("calibrate_fma_chain"),
            "two co-resident CTAs, issue-bound": ratio("calibrate_fma_wide"),
            "SM clock": statistics.median(clocks) if clocks else None}


def rows(results: dict, model: dict) -> list[dict]:
    """Each figure beside the model's, in the row's unit: within = between the optimistic and
    the pessimistic value (either way round), ratio_central = measured / central."""
    out = []
    for name, x in measured_si(results).items():
        key, unit, scale, how = ROWS[name]
        m = model.get(key)
        row = {"name": name, "input": SHOWN.get(key, key), "unit": unit, "how": how,
               "measured": _r(x * scale) if x is not None else None,
               "optimistic": None, "central": None, "pessimistic": None,
               "ratio_central": None, "within": None}
        if m is not None:
            o, c, p = (v * scale for v in m[:3])
            row.update(optimistic=_r(o), central=_r(c), pessimistic=_r(p), source=m[3])
            if x is not None:
                row.update(ratio_central=_r(x * scale / c, 3) if c else None,
                           within=bool(min(o, p) <= x * scale <= max(o, p)))
        out.append(row)
    return out


def checks(results: dict) -> list[dict]:
    """What the figures rest on, each {check, ok, detail}; GUARD marks those that read what the
    kernels wrote (a stand-in driver that computes nothing fails them)."""
    out = []
    ch = dict(results.get("chase") or {})
    chains = ch.pop("chains", None)
    if chains:
        out.append({"check": "every HBM chase step on a line no chase read before",
                    "ok": chains["hbm_fresh"], "detail": chains})
    if ch:
        ended = {k: v["ended_on_chain"] for k, v in ch.items()}
        out.append({"check": f"every chase ended on the line the chain says {GUARD}",
                    "ok": all(ended.values()), "detail": ended})
        inside = {k: v["inside_stream"] for k, v in ch.items() if v["inside_stream"] is not None}
        out.append({"check": f"every loaded chase ran inside its streaming grid's window {GUARD}",
                    "ok": bool(inside) and all(inside.values()), "detail": inside})
    ov = results.get("overlap") or {}
    placed = {f"{e} {n}": (ov[e][n]["placed_as_asked"], ov[e][n]["together"])
              for e in ("calibrate_fma_chain", "calibrate_fma_wide") if e in ov
              for n in ("one_per_sm", "two_per_sm")}
    if placed:
        out.append({"check": f"one, then two CTAs on every SM, each run's CTAs all resident "
                             f"together {GUARD}", "ok": all(a and b for a, b in placed.values()),
                    "detail": {k: {"placed": a, "together": b} for k, (a, b) in placed.items()},
                    })
    la = results.get("launch") or {}
    if la:
        out.append({"check": "the launch-cost graphs replayed, the programmatic one where the "
                             "device has programmatic launch",
                    "ok": bool(la.get("full")) and (la.get("programmatic") is not None
                                                    or "compute capability" in str(
                                                        la.get("programmatic_unavailable"))),
                    "detail": la.get("programmatic_unavailable")})
    return out


def _r(x, digits: int = 4):
    return None if x is None else float(f"{x:.{digits}g}")
