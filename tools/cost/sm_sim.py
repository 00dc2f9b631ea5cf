"""The chip as the block scheduler fills it: 132 SMs, CTAs placed as resources free up.

Each launch (a Grid) is a list of CTAs in blockIdx order, each with its seconds of work at full
rate, and one CTA's footprint: registers on each of the SM's four sub-partitions (its warps dealt
round-robin, REG_ALLOC_UNIT per warp), shared memory (with the per-block reserve), threads, one
block slot.  A CTA is placed on an SM only where its whole footprint is free, so a CTA whose
registers fill an SM (weight_grad: 250 × 256 threads) needs an SM with nothing on it.

  dispatch   grids dispatch one at a time, by priority (Grid.priority: its stream's rank, the
             plan's plan/launches/graph.PRIORITY_LANE), then in the order they were launched: the
             first grid in that order that still has CTAs to place takes every SM as it frees
             up, and no grid after it places a CTA before it has placed all of its own (so a
             grid that waits for an empty SM holds back the grids behind it, and one that fills
             the SMs holds back the rest).  A grid of a higher priority launched later goes ahead
             of the pending ones of a lower priority; CTAs already resident are never preempted
             (inputs.STREAM_PRIORITY).  `backfill=True`: later grids may take what the first
             cannot use (the report shows both).  A grid spreads its CTAs one per SM first (SMs
             in index order), then doubles up.
  launch     a grid can dispatch LAUNCH after its last predecessor ended; with a programmatic
             edge to its lane's previous grid (Grid.programmatic) it is launched as soon as that
             grid's CTAs have all started (each triggers its dependents once past its own wait:
             the kernels call griddepcontrol.launch_dependents right after griddepcontrol.wait)
             and its CTAs become resident then, holding their SM resources while they wait, and
             start working LAUNCH_PDL after that grid ends; a full edge from the other lane that
             ends later makes it a full launch (LAUNCH after that).
  bandwidth  a working CTA asks HBM and L2 for its grid's bytes spread evenly over the grid's
             work; when the working CTAs together ask more than HBM_BW (or L2_BW), all of them
             slow by the same factor (a virtual clock: every CTA's work advances at that rate).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from tools.cost.inputs import (BLOCKS_PER_SM, REG_ALLOC_UNIT, REGS_PER_SM, SMEM_ALLOC_UNIT, SMEM_PER_SM,
                     SMEM_RESERVED, SMS, SUBPARTITIONS, THREADS_PER_SM)
from tools.cost.work import cdiv

CAPACITY = (REGS_PER_SM // SUBPARTITIONS,) * SUBPARTITIONS + (SMEM_PER_SM, THREADS_PER_SM,
                                                              BLOCKS_PER_SM)


def footprint(regs: int, threads: int, shared: int) -> tuple[int, ...]:
    """One CTA's needs, CAPACITY's order: registers per sub-partition, shared, threads, 1 block."""
    warps = cdiv(threads, 32)
    per_warp = cdiv(max(regs, 1) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    per_sp = tuple((warps - k + SUBPARTITIONS - 1) // SUBPARTITIONS * per_warp
                   for k in range(SUBPARTITIONS))
    return per_sp + (cdiv(shared, SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT + SMEM_RESERVED, threads, 1)


def _add(free: list, need: tuple, sign: int) -> None:
    for k in range(len(free)):
        free[k] += sign * need[k]


@dataclass(frozen=True)
class Grid:
    label: str
    lane: int
    ctas: tuple[float, ...]        # seconds of work of each CTA at full rate, blockIdx order
    need: tuple[int, ...]          # footprint()
    hbm_bytes: float = 0.0         # the grid's, spread over its CTAs' work
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


class _GridState:
    def __init__(self, g: Grid, i: int, total_work: float):
        self.g, self.i = g, i
        self.next = 0              # next CTA to place
        self.started = 0           # CTAs working or done
        self.done = 0
        self.released = True       # False while its CTAs wait for the previous grid (Sim)
        self.waiting: list[int] = []             # SMs of CTAs resident at their wait
        self.hbm = g.hbm_bytes / total_work if total_work else 0.0   # bytes per work-second
        self.l2 = g.l2_bytes / total_work if total_work else 0.0


class Sim:
    """One replay of grids `grids` with predecessors `deps` (indices, the lane's previous first)."""

    def __init__(self, grids: list[Grid], deps, hbm_bw: float, l2_bw: float, backfill=False,
                 sms: int = SMS):
        self.grids, self.deps, self.backfill = grids, deps, backfill
        self.hbm_bw, self.l2_bw = hbm_bw, l2_bw
        self.free = [list(CAPACITY) for _ in range(sms)]
        self.st = [_GridState(g, i, sum(g.ctas)) for i, g in enumerate(grids)]
        self.after = [[] for _ in grids]
        for i, ds in enumerate(deps):
            for j in ds:
                self.after[j].append(i)
        self.t = self.v = 0.0                     # real and virtual (work) time
        self.ask_hbm = self.ask_l2 = 0.0
        self.work: list = []                      # (virtual end, seq, grid, sm)
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

    def _rate(self) -> float:
        r = 1.0
        if self.ask_hbm > self.hbm_bw:
            r = self.hbm_bw / self.ask_hbm
        if self.ask_l2 > self.l2_bw:
            r = min(r, self.l2_bw / self.ask_l2)
        return r

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

    def _begin(self, i: int, sm: int) -> None:
        s = self.st[i]
        k = s.started
        s.started += 1
        if self.start[i] is None:
            self.start[i] = self.t
        work = s.g.ctas[k] if k < len(s.g.ctas) else 0.0
        self.ask_hbm += s.hbm
        self.ask_l2 += s.l2
        self.seq += 1
        heapq.heappush(self.work, (self.v + work, self.seq, i, sm))
        if s.started == len(s.g.ctas):
            self.trigger[i] = self.t
            for d in self.after[i]:
                self._consider(d)

    # -- placement
    def _fits(self, sm: int, n) -> bool:
        f = self.free[sm]
        return (f[0] >= n[0] and f[1] >= n[1] and f[2] >= n[2] and f[3] >= n[3] and f[4] >= n[4]
                and f[5] >= n[5] and f[6] >= n[6])

    def _place(self, i: int, sm: int) -> None:
        s = self.st[i]
        _add(self.free[sm], s.g.need, -1)
        s.next += 1
        if s.next == len(s.g.ctas):
            self.placed[i] = self.t
        if s.released:
            self._begin(i, sm)
        else:
            s.waiting.append(sm)

    def _fill(self, sms) -> None:
        """Place CTAs on `sms` from the grids allowed to (the first in launch order; with
        backfill, each in turn), one per SM per pass."""
        if not self.queue:
            return
        grids = list(self.queue) if self.backfill else (self.queue[0],)
        for i in grids:
            s = self.st[i]
            n, need = len(s.g.ctas), s.g.need
            placed = True
            while placed and s.next < n:
                placed = False
                for sm in sms:
                    if s.next < n and self._fits(sm, need):
                        self._place(i, sm)
                        placed = True
        while self.queue and self.st[self.queue[0]].next == len(self.grids[self.queue[0]].ctas):
            self.queue.pop(0)
            if not self.backfill and self.queue:
                self._fill(range(len(self.free)))

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
        _add(self.free[sm], s.g.need, 1)
        self.ask_hbm -= s.hbm
        self.ask_l2 -= s.l2
        s.done += 1
        if s.done == len(s.g.ctas):
            self.end[i] = self.t
            for d in self.after[i]:
                self._consider(d)
                if self.pdl[d] and self.deps[d][0] == i:
                    self._push_timed(self.t + self.grids[d].pdl_s, "release", d)
        self._fill([sm])

    def _on_timed(self, kind: str, i: int) -> None:
        if kind == "ready":
            self.ready[i] = self.t
            self._enqueue(i)
            self._fill(range(len(self.free)))
        else:                                       # release: the wait returns
            s = self.st[i]
            s.released = True
            for sm in s.waiting:
                self._begin(i, sm)
            s.waiting = []

    def run(self) -> SimResult:
        for i in range(len(self.grids)):
            self._consider(i)
        while self.timed or self.work:
            rate = self._rate()
            t_work = (self.t + (self.work[0][0] - self.v) / rate) if self.work else float("inf")
            if self.timed and self.timed[0][0] <= t_work:
                t, _, kind, i = heapq.heappop(self.timed)
                self.v += (t - self.t) * rate
                self.t = t
                self._on_timed(kind, i)
            else:
                v_end, _, i, sm = heapq.heappop(self.work)
                self.v, self.t = max(self.v, v_end), t_work
                self._finish(i, sm)
        if any(e is None for e in self.end):
            stuck = [self.grids[i].label for i, e in enumerate(self.end) if e is None]
            raise ValueError(f"the schedule never ran {stuck[:4]}: a dependency cycle, or a CTA "
                             "that fits no SM")
        return SimResult(max(self.end), self.ready, self.placed, self.start, self.end)
