"""The chip as the block scheduler fills it: 132 SMs, CTAs placed as resources free up, each SM's
throughput shared by the CTAs working on it.

Each launch (a Grid) is a list of CTAs in blockIdx order, each a sequence of phases (its K loop,
then its prologue/epilogue: bounds.cta_phases) with its seconds of work alone on an SM, the share
of the SM's throughput it keeps busy alone, and its HBM and L2 bytes; and one CTA's footprint:
registers on each of the SM's four sub-partitions (its warps dealt round-robin, REG_ALLOC_UNIT
per warp), shared memory (with the per-block reserve), threads, one block slot.  A CTA is placed
on an SM only where its whole footprint is free, so a CTA whose registers fill an SM needs an SM
with nothing on it.

  dispatch   grids dispatch one at a time, by priority (Grid.priority: its stream's rank, the
             plan's plan/launches/graph.PRIORITY_LANE), then in the order they were launched: the
             first grid in that order that still has CTAs to place takes every SM as it frees
             up, and no grid after it places a CTA before it has placed all of its own (so a
             grid that waits for an empty SM holds back the grids behind it, and one that fills
             the SMs holds back the rest).  A grid of a higher priority launched later goes ahead
             of the pending ones of a lower priority; CTAs already resident are never preempted
             (inputs.STREAM_PRIORITY).  `backfill=True`: later grids may take what the first
             cannot use (the report shows both).  Each CTA goes to the SM that takes the most
             of its grid's CTAs, the lowest index first (inputs.PLACEMENT), so a grid spreads
             one CTA per SM before any SM gets two, and the SMs freed at one instant share the
             next CTAs.  `pack=True` (a what-if): each SM takes as many of a grid's CTAs as fit
             before the next SM does.
  launch     a grid can dispatch LAUNCH after its last predecessor ended; with a programmatic
             edge to its lane's previous grid (Grid.programmatic) it is launched as soon as that
             grid's CTAs have all started (each triggers its dependents once past its own wait:
             the kernels call griddepcontrol.launch_dependents right after griddepcontrol.wait)
             and its CTAs become resident then, holding their SM resources while they wait, and
             start working LAUNCH_PDL after that grid ends; a full edge from the other lane that
             ends later makes it a full launch (LAUNCH after that).
  one SM     the CTAs working on an SM share its tensor cores, other pipes and L1↔L2 path
             (inputs.SHARING): while their phases' shares add up to at most one they all run at
             full rate (each one's waits are the others' issue slots), past one all slow by that
             sum.
             So a grid's CTAs released together with the same work run in step — K loops
             together, then epilogues together — and one CTA's epilogue overlaps another's K
             loop only where their work is staggered.
  bandwidth  a working CTA asks HBM and L2 for its phase's bytes over the phase's work; when
             the working CTAs together ask more than HBM_BW (or L2_BW), all of them slow by the
             same factor (a virtual clock: every CTA's work advances at that rate, each SM's at
             its share of it).  A grid of plain seconds (tests, the no-op kernel) asks for the
             grid's bytes spread evenly over its work and shares no SM.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from tools.cost.inputs import (BLOCKS_PER_SM, REG_ALLOC_UNIT, REGS_PER_SM, SMEM_ALLOC_UNIT, SMEM_PER_SM,
                     SMEM_RESERVED, SMS, SUBPARTITIONS, THREADS_PER_SM)
from tools.cost.sm_clocks import AT, END, GRID, PHASES, SmClocks
from tools.cost.work import cdiv

CAPACITY = (REGS_PER_SM // SUBPARTITIONS,) * SUBPARTITIONS + (SMEM_PER_SM, THREADS_PER_SM,
                                                              BLOCKS_PER_SM)
INSTANT = 1e-12   # s: ends this close together are one instant (CTAs in step on different SMs
#                   differ by rounding only), so the SMs they free take the next CTAs together


def footprint(regs: int, threads: int, shared: int) -> tuple[int, ...]:
    """One CTA's needs, CAPACITY's order: registers per sub-partition, shared, threads, 1 block."""
    warps = cdiv(threads, 32)
    per_warp = cdiv(max(regs, 1) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    per_sp = tuple((warps - k + SUBPARTITIONS - 1) // SUBPARTITIONS * per_warp
                   for k in range(SUBPARTITIONS))
    return per_sp + (cdiv(shared, SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT + SMEM_RESERVED, threads, 1)


def slots(per_sm: int) -> tuple[int, ...]:
    """A footprint of which exactly `per_sm` fit an SM (threads: 2048 // (2048 // k) is k for
    every k ≤ 44), for a grid known only by its occupancy (bounds.bounds)."""
    return (0,) * (len(CAPACITY) - 2) + (THREADS_PER_SM // per_sm, 1)


def _add(free: list, need: tuple, sign: int) -> None:
    free[:] = [f + sign * n for f, n in zip(free, need)]


class Phase(NamedTuple):
    """A stretch of one CTA's work: its K loop, or its prologue/epilogue (bounds.cta_phases)."""
    seconds: float                 # alone on its SM, at full rate
    share: float = 0.0             # of its SM's throughput it keeps busy alone (0: none, 1: all)
    hbm_bytes: float = 0.0
    l2_bytes: float = 0.0


def makespan(durations: list[float], slots_: int) -> float:
    """Programs started in order on the first free slot (how blocks are dispatched), none
    slowing another."""
    if len(set(durations)) == 1:
        return cdiv(len(durations), slots_) * durations[0]
    heap = [0.0] * min(slots_, len(durations))
    for d in durations:
        heapq.heappush(heap, heapq.heappop(heap) + d)
    return max(heap)


@dataclass(frozen=True)
class Grid:
    label: str
    lane: int
    ctas: tuple                    # each CTA: its Phases, or plain seconds (one phase sharing
    #                                nothing, asking the grid's bytes below), blockIdx order
    need: tuple[int, ...]          # footprint()
    hbm_bytes: float = 0.0         # of plain-seconds CTAs: the grid's, spread over their work
    l2_bytes: float = 0.0
    programmatic: bool = False     # its edge to its lane's previous grid (deps[0]) is
    launch_s: float = 0.0          # LAUNCH: a full edge's gap
    pdl_s: float = 0.0             # LAUNCH_PDL: from the previous grid's end to the wait's release
    priority: int = 0              # its stream's rank: a higher one dispatches first


@dataclass
class SimResult:
    makespan: float
    ready: list                    # when each grid could first place a CTA
    placed: list                   # when its last CTA was placed on an SM
    start: list                    # its first CTA's work start
    end: list                      # its last CTA's end


_RATED: dict = {}       # id(Grid.ctas) → (that tuple, its _rated form): the variants of one
#                         replay (lanes.lane_summary) share their launches' CTAs


def _rated(g: Grid) -> list[tuple]:
    """Each CTA's phases as (seconds, share, HBM bytes per second, L2 bytes per second)."""
    hit = _RATED.get(id(g.ctas))
    if hit is not None and hit[0] is g.ctas and not g.hbm_bytes and not g.l2_bytes:
        return hit[1]
    plain = [c for c in g.ctas if not isinstance(c, tuple)]
    total = sum(plain)
    hbm = g.hbm_bytes / total if total else 0.0
    l2 = g.l2_bytes / total if total else 0.0
    out = [((c, 0.0, hbm, l2),) if not isinstance(c, tuple) else
           (tuple((sec, share, h / sec if sec else 0.0, b / sec if sec else 0.0)
                  for sec, share, h, b in c) or ((0.0, 0.0, 0.0, 0.0),))
           for c in g.ctas]
    if not g.hbm_bytes and not g.l2_bytes:
        if len(_RATED) > 4096:
            _RATED.clear()
        _RATED[id(g.ctas)] = (g.ctas, out)
    return out


class _GridState:
    def __init__(self, g: Grid, i: int):
        self.g, self.i = g, i
        self.ctas = _rated(g)
        self.next = 0              # next CTA to place
        self.started = 0           # CTAs working or done
        self.done = 0
        self.released = True       # False while its CTAs wait for the previous grid (Sim)
        self.waiting: list[int] = []             # SMs of CTAs resident at their wait


class Sim:
    """One replay of grids `grids` with predecessors `deps` (indices, the lane's previous first)."""

    def __init__(self, grids: list[Grid], deps, hbm_bw: float, l2_bw: float, backfill=False,
                 sms: int = SMS, pack: bool = False):
        self.grids, self.deps, self.backfill, self.pack = grids, deps, backfill, pack
        self.hbm_bw, self.l2_bw = hbm_bw, l2_bw
        self.st = [_GridState(g, i) for i, g in enumerate(grids)]
        self.after = [[] for _ in grids]
        for i, ds in enumerate(deps):
            for j in ds:
                self.after[j].append(i)
        self.t = self.v = 0.0                     # real and virtual (work) time
        self.sm = SmClocks(sms, CAPACITY)
        self.freed: list[int] = []                # SMs whose CTAs ended at this instant
        self.timed: list = []                     # (time, seq, kind, grid)
        self.seq = 0
        self.queue: list = []                     # grids that may place CTAs, dispatch order
        self.ready = [None] * len(grids)
        self.placed = [None] * len(grids)
        self.start = [None] * len(grids)
        self.end = [None] * len(grids)
        self.trigger = [None] * len(grids)
        self.scheduled = [False] * len(grids)
        self.pdl = [g.programmatic and bool(deps[i]) and grids[deps[i][0]].lane == g.lane
                    for i, g in enumerate(grids)]
        for i, st in enumerate(self.st):
            st.released = not self.pdl[i]

    # -- events
    def _push_timed(self, t: float, kind: str, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.timed, (t, self.seq, kind, i))

    def _consider(self, i: int) -> None:
        """Schedule grid i's launch once what it waits for allows it."""
        if self.scheduled[i]:
            return
        g, ds, pdl = self.grids[i], self.deps[i], self.pdl[i]
        full = ds[1:] if pdl else ds
        if any(self.end[j] is None for j in full) or (pdl and self.trigger[ds[0]] is None):
            return
        t = max([self.end[j] + g.launch_s for j in full] or [g.launch_s])
        if pdl:
            t = max(t, self.trigger[ds[0]] + g.pdl_s)
        self.scheduled[i] = True
        self._push_timed(max(t, self.t), "ready", i)

    # -- one SM's CTAs
    def _begin(self, i: int, sm: int) -> None:
        s = self.st[i]
        k = s.started
        s.started += 1
        if self.start[i] is None:
            self.start[i] = self.t
        self.sm.read(sm, self.v)
        c = [0.0, 0.0, 0.0, 0.0, i, s.ctas[k], 0]
        self.sm.enter(c, sm)
        self.sm.on[sm].append(c)
        if s.started == len(s.g.ctas):
            self.trigger[i] = self.t
            for d in self.after[i]:
                self._consider(d)

    def _phase_end(self, sm: int) -> None:
        """The CTAs on SM `sm` whose phase ends now: on to the next phase, or done."""
        clocks = self.sm
        clocks.read(sm, self.v)
        on = clocks.on[sm]
        first = min(c[END] for c in on)
        if clocks.clock[sm] < first:
            clocks.clock[sm] = first
        now = clocks.clock[sm] + INSTANT
        finished = []
        for c in on:
            if c[END] <= now:
                c[AT] += 1
                if c[AT] < len(c[PHASES]):
                    clocks.enter(c, sm)
                else:
                    finished.append(c)
        if finished:
            clocks.on[sm] = [c for c in on if c[AT] < len(c[PHASES])]
            for c in finished:
                self._finish(c[GRID], sm)

    # -- placement
    def _place(self, i: int, sm: int) -> None:
        s = self.st[i]
        _add(self.sm.free[sm], s.g.need, -1)
        s.next += 1
        if s.next == len(s.g.ctas):
            self.placed[i] = self.t
        if s.released:
            self._begin(i, sm)
        else:
            s.waiting.append(sm)

    def _fill(self, sms) -> None:
        """Place CTAs on `sms` from the grids allowed to (the first in launch order; with
        backfill, each in turn): each CTA on the SM that takes the most of the grid's CTAs, the
        lowest index first (inputs.PLACEMENT: an idle chip gets one per SM before any gets two); with
        `pack`, as many as fit on each SM in index order before the next."""
        if not self.queue:
            return
        grids = list(self.queue) if self.backfill else (self.queue[0],)
        for i in grids:
            s = self.st[i]
            n, need = len(s.g.ctas), s.g.need
            if self.pack:
                for sm in sms:
                    while s.next < n and self.sm.fits(sm, need):
                        self._place(i, sm)
                continue
            room = [(-r, sm) for sm in sms if s.next < n and (r := self.sm.room(sm, need)) > 0]
            heapq.heapify(room)
            while room and s.next < n:
                r, sm = heapq.heappop(room)
                self._place(i, sm)
                if r < -1:
                    heapq.heappush(room, (r + 1, sm))
        while self.queue and self.st[self.queue[0]].next == len(self.grids[self.queue[0]].ctas):
            self.queue.pop(0)
            if not self.backfill and self.queue:
                self._fill(range(len(self.sm.free)))

    def _enqueue(self, i: int) -> None:
        """Grid i joins the dispatch queue behind every grid of its priority or a higher one and
        ahead of the lower ones (the hardware's pending work of a higher-priority stream first)."""
        p = self.grids[i].priority
        at = next((k for k, j in enumerate(self.queue) if self.grids[j].priority < p),
                  len(self.queue))
        self.queue.insert(at, i)

    # -- the loop
    def _finish(self, i: int, sm: int) -> None:
        s = self.st[i]
        _add(self.sm.free[sm], s.g.need, 1)
        s.done += 1
        if s.done == len(s.g.ctas):
            self.end[i] = self.t
            for d in self.after[i]:
                self._consider(d)
                if self.pdl[d] and self.deps[d][0] == i:
                    self._push_timed(self.t + self.grids[d].pdl_s, "release", d)
        self.freed.append(sm)

    def _on_timed(self, kind: str, i: int) -> None:
        if kind == "ready":
            self.ready[i] = self.t
            self._enqueue(i)
            self._fill(range(len(self.sm.free)))
        else:                                       # release: the wait returns
            s = self.st[i]
            s.released = True
            for sm in s.waiting:
                self._begin(i, sm)
            s.waiting = []

    def run(self) -> SimResult:
        for i in range(len(self.grids)):
            self._consider(i)
        while True:
            nxt = self.sm.next_end()
            rate = self.sm.rate(self.hbm_bw, self.l2_bw)
            t_work = (self.t + max(0.0, nxt[0] - self.v) / rate) if nxt else float("inf")
            t_next = min(t_work, self.timed[0][0] if self.timed else float("inf"))
            if self.freed and t_next > self.t + INSTANT:
                # the SMs freed at this instant take the waiting CTAs together (CTAs that end in
                # step free their SMs at once: the next ones spread over all of them)
                freed, self.freed = sorted(set(self.freed)), []
                self._fill(freed)
                self.sm.settle()
                continue
            if t_next == float("inf"):
                break
            if self.timed and self.timed[0][0] <= t_work:
                t, _, kind, i = heapq.heappop(self.timed)
                self.v += (t - self.t) * rate
                self.t = t
                self._on_timed(kind, i)
            else:
                v_end, _, sm, _ = heapq.heappop(self.sm.work)
                self.v, self.t = max(self.v, v_end), t_work
                self._phase_end(sm)
            self.sm.settle()
        if any(e is None for e in self.end):
            stuck = [self.grids[i].label for i, e in enumerate(self.end) if e is None]
            raise ValueError(f"the schedule never ran {stuck[:4]}: a dependency cycle, or a CTA "
                             "that fits no SM")
        return SimResult(max(self.end), self.ready, self.placed, self.start, self.end)


@lru_cache(maxsize=4096)
def alone(ctas: tuple, per_sm: int, sms: int = SMS, pack: bool = False,
          hbm_bw: float = float("inf"), l2_bw: float = float("inf")) -> float:
    """Seconds of one grid alone on `sms` SMs, `per_sm` of its CTAs fitting each (each CTA its
    Phases), co-resident CTAs sharing their SM and, where `hbm_bw` / `l2_bw` are given, every
    phase asking the chip's HBM and L2 for its own bytes.  Spread one per SM with no bandwidth
    limit, a grid of at most `sms` CTAs shares nothing: its longest CTA."""
    unlimited = hbm_bw == float("inf") and l2_bw == float("inf")
    if unlimited and ((len(ctas) <= sms and not pack) or all(p.share == 0 for c in ctas for p in c)):
        return makespan([sum(p.seconds for p in c) for c in ctas], sms * per_sm) if ctas else 0.0
    g = Grid("alone", 0, ctas, slots(per_sm))
    return Sim([g], [()], hbm_bw, l2_bw, sms=sms, pack=pack).run().makespan
