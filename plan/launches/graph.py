"""A submission's dependency graph, as data: two lanes (CONTRACT §7: one graph per submission, issued
by one launch) and the edges between them.

Each launch runs on a lane (`Launch.lane`): the main lane is the critical chain, the side lane a
branch of launches that feed nothing on the main lane (the weight gradients with AdamW).
Within a lane, launches follow each other in list order; a launch waits for the launches of the
other lane that `Launch.after` names by label — the side lane forks after the main-lane launch
that produced its last input and joins before whatever reads what it writes (the final release at
the latest: the host's fence means the whole issue is done).  `dependencies` turns that into each
launch's predecessors and refuses a graph a backend could not capture as planned; the backends
(cuda: two streams and events during stream capture; interpret: a topological order) run exactly
these edges.  Plain data: no Triton.
"""
from __future__ import annotations

import dataclasses

from coppelius.plan.launches.types import HAND_WRITTEN, LANES, MAIN_LANE, SIDE_LANE, Launch


class GraphError(ValueError):
    """A launch list whose lanes and `after` labels do not make a capturable graph."""


# The lane captured on a stream of the device's greatest priority (the other lane at the default),
# so that the block scheduler dispatches its pending CTAs first whenever SMs free up (it never
# preempts a resident CTA); None: no lane first.  The cost model weighs the choices (`python -m
# tools.build_ptx --report --json`, lanes.scenarios.<s>.priority_graph_us: the update with no
# priority and with it on each lane): the side lane first — the weight gradients with AdamW, the
# issue's critical lane — is the fastest, 1117 / 1468 / 2154 µs (optimistic / central /
# pessimistic) against 1136 / 1490 / 2154 with no priority and 1143 / 1491 / 2180 with the main
# lane first: its weight gradients' CTAs get the SMs that free up instead of queueing behind the
# main lane's grids.  The cuda backend's capture (host/backends/cuda/capture.py) and the cost model
# (tools/cost/lanes.py) read it from here, the device check measures it against no priority
# (tools/gpu_check/experiments.py), and tests/tools/test_cost_lanes.py fails when the model finds
# another choice more than 1% faster (central): when the kernels change, follow the model.
PRIORITY_LANE: int | None = SIDE_LANE


def priority_ranks(priority_lane: int | None) -> dict[int, int]:
    """lane → the rank of its stream: 1 for `priority_lane`, 0 (the default priority) for the
    other; every lane 0 for None (no stream priority: the device check's variant)."""
    return {lane: int(lane == priority_lane) for lane in LANES}


def dependencies(launches) -> tuple[tuple[int, ...], ...]:
    """The predecessors of every launch: the previous launch of its lane, then the launches its
    `after` labels name (on the other lane, earlier in the list).  Refuses unknown, later,
    same-lane or ambiguous labels, a side lane that does not start from a fork, a first launch
    that is not on the main lane, and a last launch that is not reached from every launch."""
    index: dict[str, int] = {}
    for i, launch in enumerate(launches):
        if launch.lane not in LANES:
            raise GraphError(f"{launch.label}: lane {launch.lane} is not one of {LANES}")
        if launch.label in index:
            index[launch.label] = -1                      # ambiguous: refused if named
        else:
            index[launch.label] = i
    deps, last_on = [], {}
    for i, launch in enumerate(launches):
        own = [last_on[launch.lane]] if launch.lane in last_on else []
        cross = []
        for label in launch.after:
            j = index.get(label)
            if j is None or j == -1:
                raise GraphError(f"{launch.label} waits for {label!r}, which names "
                                 f"{'no launch' if j is None else 'several launches'}")
            if j >= i:
                raise GraphError(f"{launch.label} waits for {label}, which comes later in the "
                                 "list; hint: the list order must be a topological order")
            if launches[j].lane == launch.lane:
                raise GraphError(f"{launch.label} waits for {label} on its own lane: lane order "
                                 "already orders them")
            cross.append(j)
        if not own and launch.lane != MAIN_LANE and not cross:
            raise GraphError(f"{launch.label} starts lane {launch.lane} without waiting for a "
                             "main-lane launch; hint: fork it with after=")
        if i == 0 and (launch.lane != MAIN_LANE or cross):
            raise GraphError(f"{launch.label}: the first launch must be on the main lane and "
                             "wait for nothing")
        deps.append(tuple(own + sorted(set(cross))))
        last_on[launch.lane] = i
    deps = tuple(deps)
    if launches:
        _check_joined(launches, deps)
    return deps


def programmatic(launches) -> tuple[bool, ...]:
    """Per launch: whether its edge to the previous launch of its lane may be programmatic
    (programmatic dependent launch): both are Triton kernels, whose first statement
    waits for the grids before them (plan/kernels/grid_dependency.py), so the next one's launch
    and block dispatch may overlap the previous one's work.  The first launch of a lane has no
    such predecessor, and the hand-written kernels (release, release_stage_in) neither wait nor
    let the next launch early: those edges stay full, as do the cross-lane ones.  A backend
    overlaps only where the loaded kernels were built to wait (the sm_90a PTX; the cuda backend
    checks each kernel's manifest `pdl`); the cost model charges these edges LAUNCH_PDL."""
    out, last = [], {}
    for launch in launches:
        prev = last.get(launch.lane)
        out.append(prev is not None and launch.function not in HAND_WRITTEN
                   and prev.function not in HAND_WRITTEN)
        last[launch.lane] = launch
    return tuple(out)


def ancestors(deps) -> list[int]:
    """Bit sets (Python ints): bit j of entry i is set when launch j must finish before launch i
    starts (a path j → … → i)."""
    out = []
    for ds in deps:
        bits = 0
        for j in ds:
            bits |= out[j] | (1 << j)
        out.append(bits)
    return out


def ordered(anc: list[int], i: int, j: int) -> bool:
    """Whether the graph orders launches i and j (either way)."""
    return bool(anc[i] >> j & 1 or anc[j] >> i & 1)


def _check_joined(launches, deps) -> None:
    anc = ancestors(deps)
    last = len(launches) - 1
    if launches[last].lane != MAIN_LANE:
        raise GraphError(f"{launches[last].label}: the last launch must be on the main lane")
    loose = [launches[i].label for i in range(last) if not anc[last] >> i & 1]
    if loose:
        raise GraphError(f"{launches[last].label} does not wait for {loose[:4]}; hint: join the "
                         "side lane before the final release (after=)")


def topological_order(launches, deps, prefer: int = MAIN_LANE) -> list[int]:
    """A valid order of the launches: repeatedly the first ready launch of lane `prefer`, else the
    first ready one.  prefer=SIDE_LANE runs every side launch as early as its edges allow (the list
    order when the list places each side launch right after its fork); prefer=MAIN_LANE as late."""
    n = len(launches)
    waiting = [len(set(d)) for d in deps]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for j in set(ds):
            users[j].append(i)
    ready = [i for i in range(n) if not waiting[i]]
    order = []
    while ready:
        pick = next((i for i in ready if launches[i].lane == prefer), ready[0])
        ready.remove(pick)
        order.append(pick)
        for u in users[pick]:
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
        ready.sort()
    if len(order) != n:
        raise GraphError("the dependency graph has a cycle")
    return order


def forked(launch: Launch, after: Launch, lane: int) -> Launch:
    """`launch` moved to `lane`, waiting for `after` (a launch of the other lane)."""
    return dataclasses.replace(launch, lane=lane, after=launch.after + (after.label,))
