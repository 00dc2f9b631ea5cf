"""A submission's time as its dependency graph runs it: two lanes, one chip.

The update's weight-gradient launches (AdamW in their epilogues) run on a side lane, concurrent
with the main lane's critical dx/dh chain (plan/launch_graph.py).  The per-launch model
(per_launch.py) costs each launch alone on the whole chip; this module replays the graph
in time with an honest charge for what the two lanes share:

  order     each lane runs its launches in list order; a launch starts when its lane is free
            and every predecessor (`Submission.deps`) has finished.  It first spends its launch
            cost (LAUNCH: the graph node's gap, ramp and tail) on its own lane, holding nothing;
            LAUNCH_PDL instead where its edge to its lane's previous launch is programmatic
            (`LaunchCost.programmatic`) and that launch is the last of its predecessors to
            finish (a cross-lane edge that resolves later is a full edge).
  SMs       while a side-lane launch works it holds min(132, ⌈programs / per SM⌉) SMs (its grid
            is capped by `dw_programs`; at ptxas' 248 registers × 256 threads one block fills an
            SM's register file, so no main-lane block shares those SMs); a main-lane launch
            working meanwhile is re-costed on the rest: its tensor, pipes, per-SM L2 and
            serial/wave bounds with 132 − held SMs (bounds.bounds(sms=...)).  The side
            launch itself is costed on the SMs it holds (with 2 blocks per SM its programs
            share their SMs' tensor cores and L2 paths).  Alone, a launch has all 132.
  bandwidth while both lanes work, chip-wide HBM and L2 bandwidth are shared: each launch asks
            for its bytes over its duration; if the two asks exceed HBM_BW (or L2_BW), both slow
            by the same factor so that together they move exactly the bandwidth — so each
            launch's time is at least its bytes over its share of each bandwidth.
  not charged: L2 capacity (the side lane's P/M/V tiles evicting the main lane's operands), and
            any block-scheduler priority between the lanes (none is set): both optimistic.

Time advances event to event (a launch cost ends, a launch finishes), the two launches' progress
as fractions of their work at the rates above.  The result is the makespan, per scenario, with
how long each lane was busy and how long both worked at once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from plan import launches
from plan.buffers import buffers
from plan.launch_types import MAIN_LANE, SIDE_LANE

from .bounds import PerProgram, bounds
from .inputs import HBM_BW, L2_BW, LAUNCH, LAUNCH_PDL, SCENARIOS, SMS
from .per_launch import LaunchCost, work_of
from .work import cdiv


@dataclass
class LaneTimes:
    makespan_s: float
    busy_s: dict                   # lane → seconds from a launch's start to its end, summed
    both_working_s: float          # seconds with a launch of each lane in its work phase
    end_s: list                    # (launches,) finish time of each launch


class LaneJob:
    """One launch for the schedule: its work, and its duration on a number of SMs (cached)."""

    def __init__(self, launch, cost: LaunchCost, bufs):
        self.launch, self.cost = launch, cost
        self.work = work_of(launch, bufs)
        self.per = PerProgram.of(self.work)
        self.held = min(SMS, cdiv(cost.programs, cost.per_sm))
        self._d = {}

    def duration(self, s: str, sms: int) -> float:
        if (s, sms) not in self._d:
            self._d[s, sms] = max(bounds(self.work, self.per, self.cost.per_sm, s, sms).values())
        return self._d[s, sms]


def launch_cost(sub, costs, end, i: int, s: str) -> float:
    """Seconds launch i spends launching once its predecessors are done: LAUNCH_PDL when its edge
    to its lane's previous launch is programmatic and that launch finished last, else LAUNCH."""
    deps = sub.deps[i]
    if not (costs[i].programmatic and deps):
        return LAUNCH[s]
    own = deps[0]                 # launch_graph.dependencies: the lane predecessor comes first
    if sub.launches[own].lane != sub.launches[i].lane:
        return LAUNCH[s]
    return LAUNCH_PDL[s] if end[own] >= max(end[j] for j in deps) else LAUNCH[s]


def schedule(sub, costs, bufs, s: str) -> LaneTimes:
    """Replay submission `sub` (its launches, lanes and deps) in scenario s."""
    jobs = [LaneJob(x, c, bufs) for x, c in zip(sub.launches, costs)]
    lanes = {lane: [i for i, x in enumerate(sub.launches) if x.lane == lane]
             for lane in (MAIN_LANE, SIDE_LANE)}
    nxt = {lane: 0 for lane in lanes}
    end = [None] * len(jobs)
    run: dict[int, list] = {}          # lane → [launch index, phase, left (s or fraction), start]
    busy = {lane: 0.0 for lane in lanes}
    t = both = 0.0
    while any(nxt[lane] < len(lanes[lane]) for lane in lanes) or run:
        for lane, order in lanes.items():           # start what is ready
            if lane not in run and nxt[lane] < len(order):
                i = order[nxt[lane]]
                if all(end[j] is not None for j in sub.deps[i]):
                    run[lane] = [i, "launch", launch_cost(sub, costs, end, i, s), t]
                    nxt[lane] += 1
        if not run:
            raise ValueError(f"{sub.name}: the lanes wait on each other (a dependency cycle)")
        rates = _rates(jobs, run, s)
        dt = min(left / rates[lane] if phase == "work" else left
                 for lane, (i, phase, left, _) in run.items())
        if sum(phase == "work" for _, phase, _, _ in run.values()) == 2:
            both += dt
        t += dt
        for lane in list(run):
            i, phase, left, start = run[lane]
            left -= dt * rates[lane] if phase == "work" else dt
            if left > (1e-12 if phase == "work" else 1e-18):     # a fraction, or seconds
                run[lane][2] = left
            elif phase == "launch":
                run[lane][1:3] = ["work", 1.0]
            else:
                end[i] = t
                busy[lane] += t - start
                del run[lane]
    return LaneTimes(t, busy, both, end)


def _rates(jobs, run, s: str) -> dict:
    """Fraction of its work per second of each working launch, given who else works."""
    working = {lane: r[0] for lane, r in run.items() if r[1] == "work"}
    side = working.get(SIDE_LANE)
    dur = {}
    for lane, i in working.items():
        if lane == SIDE_LANE:
            sms = jobs[i].held
        else:
            sms = SMS - jobs[side].held if side is not None else SMS
        dur[lane] = jobs[i].duration(s, max(sms, 1))
    slow = 1.0
    if len(working) == 2:
        hbm = sum(jobs[i].work.hbm_bytes / dur[lane] for lane, i in working.items())
        l2 = sum(jobs[i].cost.l2_bytes / dur[lane] for lane, i in working.items())
        slow = min(1.0, HBM_BW[s] / hbm if hbm else 1.0, L2_BW[s] / l2 if l2 else 1.0)
    return {lane: (slow / dur[lane] if lane in dur else 0.0) for lane in run}


def lane_summary(sub, costs, bufs) -> dict:
    """Per scenario: the graph's makespan and the lanes' figures, µs; `full_edges_graph_us`: the
    makespan with every edge full (no programmatic launch), for the report's comparison."""
    out = {}
    full = [dataclasses.replace(c, programmatic=False) for c in costs]
    for s in SCENARIOS:
        r = schedule(sub, costs, bufs, s)
        alone = {lane: sum(c.us[s] for x, c in zip(sub.launches, costs) if x.lane == lane)
                 for lane in (MAIN_LANE, SIDE_LANE)}
        out[s] = {"graph_us": r.makespan_s * 1e6,
                  "main_lane_alone_us": alone[MAIN_LANE], "side_lane_alone_us": alone[SIDE_LANE],
                  "main_lane_busy_us": r.busy_s[MAIN_LANE] * 1e6,
                  "side_lane_busy_us": r.busy_s[SIDE_LANE] * 1e6,
                  "both_working_us": r.both_working_s * 1e6,
                  "programmatic_edges": sum(c.programmatic for c in costs),
                  "full_edges_graph_us": schedule(sub, full, bufs, s).makespan_s * 1e6}
    return out


def replay(profile, submission: str, costs) -> dict:
    """`lane_summary` of a profile's submission by name (its launch list and buffers)."""
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    return lane_summary(sub, costs, buffers(profile))
