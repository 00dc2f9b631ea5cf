"""A submission's time as its dependency graph runs it: two lanes, one chip, CTA by CTA.

The update's weight-gradient launches (AdamW in their epilogues) run on a side lane, concurrent
with the main lane's critical dx/dh chain (plan/launches/graph.py).  The per-launch model
(per_launch.py) costs each launch alone on the whole chip; this module replays the graph on the
block scheduler's terms (sm_sim.py): every launch's CTAs, each its program's phases (its loop,
then its prologue/epilogue: bounds.cta_phases), placed on SMs as their registers and shared
memory free up, the grids of the plan's priority lane (plan/launches/graph.PRIORITY_LANE, the
stream the cuda backend captures it on) ahead of the other's, then in launch order; a
programmatic edge lets a grid's CTAs sit resident at their wait; the CTAs working on an SM share
its tensor cores, pipes and L1↔L2 path (whichever lane they belong to), and every CTA the HBM
and L2 bandwidth.

Nothing reserves SMs for a lane: a side-lane CTA waits for an SM with room for its registers
and shared memory, and while it waits the grids behind it in dispatch order wait too (or, with
`backfill`, take what it cannot use).  Per lane the result gives when its first launch could
start and when its last one ended, and which lane the graph's last launch waited for last: the
critical one.  The summary
also replays the graph with no stream priority and with the priority on each lane: the choices
PRIORITY_LANE is made from.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import launches
from coppelius.plan.launches.types import LANES, MAIN_LANE, SIDE_LANE

from tools.cost.bounds import cta_phases, hbm_bytes, pcie_time, serial_time
from tools.cost.inputs import BF16_FLOPS, HBM_BW, L2_BW, LAUNCH, LAUNCH_PDL, SCENARIOS
from tools.cost.sm_sim import Grid, Sim, footprint

LANE_NAMES = {MAIN_LANE: "main", SIDE_LANE: "side"}
BACKWARD = "backward"          # in a main-lane label: the launch opens the backward window (windows)
NOOP = "noop"                 # the device check's no-op kernel: one thread, no work, full edges
PLAN = "plan"                 # priority_lane: the plan's (launch_graph.PRIORITY_LANE, per call)


@dataclass
class LaneTimes:
    makespan_s: float
    end_s: list                    # (launches,) finish time of each launch
    ready_s: list                  # when each could first place a CTA
    placed_s: list                 # when its last CTA had an SM
    start_s: list                  # its first CTA's work start
    lanes: dict                    # lane name → {"start_s", "end_s"}
    critical: str                  # the lane the graph's last launch waited for last


def grid(launch, cost, s: str, rank: int = 0, pack: bool = False) -> Grid:
    """One launch for the schedule: its programs' phases (bounds.cta_phases: seconds, the share
    of an SM each keeps busy, HBM and L2 bytes), which the replay runs on the SMs they share and
    the bandwidth they share — the launch's tensor, pipes, L2 and HBM bounds come out of that —
    stretched only where mapped host memory binds it (the replay does not share PCIe: the
    stretch is latency, so its share of the SM falls); `rank`: its stream's priority rank
    (launch_graph.priority_ranks); `pack`: the what-if placement (sm_sim.py)."""
    if cost.function == NOOP:
        return Grid(launch.label, launch.lane, (0.0,), footprint(1, 1, 0), launch_s=LAUNCH[s],
                    priority=rank)
    ctas = cta_phases(cost.work, s)
    pcie = pcie_time(cost.work, s) if cost.work.staging else 0.0
    serial = serial_time(cost.work, cost.per_sm, s) if pcie else 0.0
    if serial > 0 and pcie > serial:
        k = pcie / serial
        ctas = tuple(tuple(p._replace(seconds=p.seconds * k, share=p.share / k) for p in c)
                     for c in ctas)
    return Grid(launch.label, launch.lane, ctas, footprint(cost.regs, cost.threads, cost.smem),
                programmatic=cost.programmatic, launch_s=LAUNCH[s], pdl_s=LAUNCH_PDL[s],
                priority=rank)


def noop_cost(cost):
    """A launch replaced by the device check's no-op kernel (host/backends/cuda/capture.py NOOP_GRID)."""
    return dataclasses.replace(cost, function=NOOP, programmatic=False)


def _lanes(sub, r) -> tuple[dict, str]:
    """Per lane (µs-free: seconds) its first launch's ready time and its last launch's end — the
    graph's last launch, which joins the lanes, apart — and the lane that launch waited for last."""
    last = max(range(len(sub.launches)), key=lambda i: r.end[i])
    join = last if len(sub.deps[last]) > 1 else None
    out = {}
    for lane, name in LANE_NAMES.items():
        idx = [i for i, x in enumerate(sub.launches) if x.lane == lane and i != join]
        if idx:
            out[name] = {"start_s": min(r.ready[i] for i in idx),
                         "end_s": max(r.end[i] for i in idx)}
    ds = sub.deps[last]
    waited = max(ds, key=lambda j: r.end[j]) if ds else last
    return out, LANE_NAMES[sub.launches[waited].lane]


def schedule(sub, costs, s: str, backfill: bool = False, priority_lane=PLAN,
             pack: bool = False) -> LaneTimes:
    """Replay submission `sub` (its launches, lanes and deps) in scenario s, the lane
    `priority_lane` (PLAN: the plan's; None: no stream priority) on the higher-priority stream;
    `pack`: each SM takes as many of a grid's CTAs as fit before the next (a what-if)."""
    if priority_lane == PLAN:
        priority_lane = launch_graph.PRIORITY_LANE
    ranks = launch_graph.priority_ranks(priority_lane)
    grids = [grid(x, c, s, ranks[x.lane], pack) for x, c in zip(sub.launches, costs)]
    r = Sim(grids, sub.deps, HBM_BW[s], L2_BW[s], backfill, pack=pack).run()
    lanes, critical = _lanes(sub, r)
    return LaneTimes(r.makespan, r.end, r.ready, r.placed, r.start, lanes, critical)


def _us(lanes: dict) -> dict:
    return {k: {"start_us": v["start_s"] * 1e6, "end_us": v["end_s"] * 1e6} for k, v in lanes.items()}


def _priorities(sub, costs, s: str, planned: LaneTimes) -> dict:
    """`priority_lane` (the plan's, by name, or None); `no_priority`: the graph, lanes and
    critical lane with no stream priority; `priority_graph_us`: the graph with no priority
    ("none") and with it on each lane (`planned`: the plan's replay); `priority_fastest`: the
    choice of those the model finds fastest."""
    plan = launch_graph.PRIORITY_LANE
    none = planned if plan is None else schedule(sub, costs, s, priority_lane=None)
    each = {LANE_NAMES[lane]: (planned if lane == plan else
                               schedule(sub, costs, s, priority_lane=lane)).makespan_s * 1e6
            for lane in LANES}
    graphs = {"none": none.makespan_s * 1e6, **each}
    return {"priority_lane": None if plan is None else LANE_NAMES[plan],
            "no_priority": {"graph_us": none.makespan_s * 1e6, "lanes": _us(none.lanes),
                            "critical": none.critical},
            "priority_graph_us": graphs, "priority_fastest": min(graphs, key=graphs.get)}


def windows(sub, costs, r: LaneTimes, s: str) -> list[dict]:
    """The replay cut in two at the start of the first main-lane launch whose label names the
    backward (the update: head_backward.dx): the forward window before it, the backward window
    from it to the graph's end (one window, "whole", where no launch names it).  Per window its
    µs and what its launches ask of the chip — L2 and HBM bytes (HBM less the fresh bytes still
    in L2: bounds.hbm_bytes) and MMA FLOPs — each over the window at the scenario's rate: how near
    the window runs to that floor.  A launch counts wholly in the window its first CTA started
    in.  A window near its L2 or HBM floor goes faster only with fewer bytes; one far below every
    floor waits on chains, launches and tails."""
    cut = next((r.start_s[i] for i, x in enumerate(sub.launches)
                if x.lane == MAIN_LANE and BACKWARD in x.label), None)
    spans = ([("forward", 0.0, cut), ("backward", cut, r.makespan_s)] if cut is not None
             else [("whole", 0.0, r.makespan_s)])
    out = []
    for name, t0, t1 in spans:
        idx = [i for i in range(len(costs))
               if r.start_s[i] >= t0 and (r.start_s[i] < t1 or t1 == r.makespan_s)]
        dt = t1 - t0
        l2 = sum(costs[i].l2_bytes for i in idx)
        hbm = sum(hbm_bytes(costs[i].work, s) for i in idx)
        flops = sum(costs[i].flops for i in idx)
        out.append({"window": name, "start_us": t0 * 1e6, "end_us": t1 * 1e6,
                    "launches": len(idx), "l2_bytes": l2, "hbm_bytes": hbm, "flops": flops,
                    "l2_use": l2 / (L2_BW[s] * dt) if dt > 0 else 0.0,
                    "hbm_use": hbm / (HBM_BW[s] * dt) if dt > 0 else 0.0,
                    "tensor_use": flops / (BF16_FLOPS[s] * dt) if dt > 0 else 0.0})
    return out


def lane_summary(sub, costs) -> dict:
    """Per scenario: the graph's makespan, per lane its start and end and which is critical (µs),
    the plan's priority lane on the higher-priority stream; `full_edges_graph_us`: every edge
    full; `backfill_graph_us` (central only): later grids may take the SMs the first grid in
    dispatch order cannot use; `*_alone_us`: each lane's launches alone, summed;
    `side_waited_us`: the side lane's launches' waits, summed, from their launch until their last
    CTA had an SM; `windows`: the forward and backward windows' use of L2, HBM and the tensor
    rate; the priority variants (`_priorities`)."""
    out = {}
    full = [dataclasses.replace(c, programmatic=False) for c in costs]
    for s in SCENARIOS:
        r = schedule(sub, costs, s)
        alone = {lane: sum(c.us[s] for x, c in zip(sub.launches, costs) if x.lane == lane)
                 for lane in LANE_NAMES}
        side = [i for i, x in enumerate(sub.launches) if x.lane == SIDE_LANE]
        out[s] = {"graph_us": r.makespan_s * 1e6, "lanes": _us(r.lanes), "critical": r.critical,
                  "main_lane_alone_us": alone[MAIN_LANE], "side_lane_alone_us": alone[SIDE_LANE],
                  "side_waited_us": sum(r.placed_s[i] - r.ready_s[i] for i in side) * 1e6,
                  "programmatic_edges": sum(c.programmatic for c in costs),
                  "full_edges_graph_us": schedule(sub, full, s).makespan_s * 1e6,
                  "windows": windows(sub, costs, r, s),
                  **_priorities(sub, costs, s, r)}
    out["central"]["backfill_graph_us"] = schedule(sub, costs, "central",
                                                   backfill=True).makespan_s * 1e6
    return out


def replay(profile, submission: str, costs) -> dict:
    """`lane_summary` of a profile's submission by name."""
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    return lane_summary(sub, costs)

