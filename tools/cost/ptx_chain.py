"""Dependent memory round trips per tile, counted from a kernel's PTX (the cost model's chain term).

A program's time has a floor no bandwidth shows: the chain of global loads each of which cannot
be issued before an earlier one has come back.  This pass walks each `.entry` in program order and
gives every value a *level*: the number of round trips to device memory that must complete, one
after another, before it exists.

  - A global load (`ld.global…`, `ld.relaxed.sys.global…`, `cp.async…shared.global`) is issued at
    the level of its address and guard registers, and never before the last earlier global store,
    CTA barrier or fence — the *ordering level*: ptxas cannot hoist a load above a store it cannot
    prove disjoint (the P/M/V planes are one buffer addressed from one pointer), nor across a
    barrier.  Its result is one level later.  `ld.global.nc` (read-only) is not held back by
    stores.
  - A global store issues at the level of its data, address and guard, and raises the ordering
    level to it (it needs no round trip itself: stores are posted).
  - `bar.sync` issues when this thread's earlier memory instructions have issued (the barrier
    waits for every warp to get there): it raises the ordering level and the shared-memory level
    to the highest level any memory instruction before it issued at.  A value staged through
    shared memory (`st.shared`, `stmatrix`) and read back (`ld.shared`, `ldmatrix`, `wgmma`'s
    descriptors) carries the level of what was stored; `cp.async.wait_group N` makes the groups
    older than the newest N visible to shared-memory reads.
  - Everything else (arithmetic, conversions, shuffles, moves) is at the highest level it reads.

Two loads are *independent* when neither waits for the other: they sit at the same level, and a
level counts once however many loads issue at it.  A load is *dependent* when its level exceeds
every earlier load's — because its address is computed from a loaded value, or because it follows
(in program order) a store or barrier whose data or arrival waited for a load.  So the count is
the longest chain: the highest level minus the level the region starts at.

*Of the same tile* means within one program's straight-line code for one tile: the body of its
tile loop (weight_grad's `for pid in range(…)`: one trip of it is one tile) or, with no tile loop,
the whole entry; Triton unrolls the epilogue's static loops (weight_grad's column eighths), so
they are straight-line code here.  The *epilogue* is the code after the tile's last inner loop (the
K loop of a matmul: `wgmma` on `cp.async`-filled shared memory) to the end of the tile; with no
inner loop, the whole tile.  The K loop counts once, not as a chain: one trip of it is walked
(its prefetches for later trips are dropped at its exit), so the tile sees its *fill* (the first
chunks' round trip); every further trip is the cost model's per-trip step.  A loop's *trip*
figure is the steady state: round trips per trip over TRIPS trips of its body (½ for a pipeline
that prefetches two trips ahead, 1 for a loop that loads and then uses in the same trip).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tools.cost.ptx_levels import State
from tools.cost.ptx_ops import Ops, count_ops
from tools.cost.ptx_parse import Block, Loop, blocks_of, entry_bodies, natural_loops

TRIPS = 8                      # trips of a loop body walked for its steady-state round trips
PTX_DIR = Path(__file__).resolve().parents[2] / "kernels_ptx"


@dataclass(frozen=True)
class LoopChain:
    header: str                    # the loop header's label
    trip: float                    # steady-state round trips per trip
    inner: bool                    # contains no other loop
    pipelined: bool                # waits only for copies issued in earlier trips (cp.async N > 0)
    mma: bool = False              # its body multiplies (wgmma.mma_async or mma.sync)


@dataclass(frozen=True)
class Chain:
    """One entry's dependent round trips (levels), as the module docstring defines them."""
    entry: str
    tile: int                      # one tile's straight-line code: before + fill + epilogue
    before: int                    # in the tile, before its first inner loop
    fill: int                      # the inner loops' first trip (a K loop's fill)
    epilogue: int                  # after the tile's last inner loop, to the end of the tile
    prologue: int                  # before the tile loop, once a program (0 with no tile loop)
    loops: tuple[LoopChain, ...]   # every loop, innermost first
    ops: Ops                       # the epilogue's issue slots per thread (ptx_ops.py)
    mma_sync: bool = False         # multiplies with mma.sync and no wgmma (bounds.mma_rate)
    wgmma_trip: int = 0            # wgmma.mma_async in one trip of its inner loops (the most)
    wgmma_tail: int = 0            # … in one tile's straight-line code (the loops apart)

    @property
    def per_trip(self) -> float:
        """Round trips each further trip of an unpipelined inner loop adds (the largest)."""
        return max((lp.trip for lp in self.loops if lp.inner and not lp.pipelined), default=0.0)

    def per_trip_of(self, mma: bool) -> float:
        """per_trip over the inner loops that multiply (mma) or that do not: a kernel whose
        programs run different loops (attention_bwd_dq: dQ's products, the merge's sums) charges
        each kind its own loop's waits."""
        return max((lp.trip for lp in self.loops
                    if lp.inner and not lp.pipelined and lp.mma == mma), default=0.0)


class _Walk:
    """Blocks of a region (a loop's body from its header, or the whole entry) walked once in
    reverse postorder: edges back to the region's header and inner loops' back edges not taken,
    an inner loop's exit dropping the cp.async groups its body committed (prefetches)."""

    def __init__(self, blocks: list[Block], rpo: list[int], loops: list[Loop], region, header: int):
        self.blocks, self.loops = blocks, [lp for lp in loops if lp.body <= region
                                           and lp.header != header]
        self.order = [b for b in rpo if b in region]
        self.header = header
        self.out: dict[int, State] = {}
        self.inn: dict[int, State] = {}
        self.entry_groups: dict[int, set] = {}
        self.gid = 0

    def next_gid(self) -> int:
        self.gid += 1
        return self.gid

    def _edge_state(self, u: int, v: int) -> State:
        s = self.out[u]
        left = [lp for lp in self.loops if u in lp.body and v not in lp.body]
        entered = any(lp.header == v for lp in self.loops)
        if left or entered:
            s = s.copy()
            s.in_order()
        if left:
            keep = set.intersection(*(self.entry_groups[lp.header] for lp in left))
            s.groups = [g for g in s.groups if g[0] in keep]
            s.open = None
        return s

    def run(self, start: State) -> "_Walk":
        headers = {lp.header for lp in self.loops}
        for b in self.order:
            preds = [u for u in self.out if b in self.blocks[u].succs and b != self.header
                     and not any(b == lp.header and u in lp.latches for lp in self.loops)]
            s = start.copy()
            if preds:
                s = self._edge_state(preds[0], b)
                for u in preds[1:]:
                    s = s.join(self._edge_state(u, b))
                s = s.copy()
            if b in headers:
                self.entry_groups[b] = {g[0] for g in s.groups}
            self.inn[b] = s.copy()
            for ins in self.blocks[b].instrs:
                s.step(ins, self.next_gid)
            self.out[b] = s
        return self

    def exit_level(self, lp: Loop) -> tuple[int, int]:
        """(level entering loop lp, level on leaving it), over the walk."""
        leaving = [self._edge_state(u, v).level for u in lp.body for v in self.blocks[u].succs
                   if v not in lp.body and u in self.out]
        return self.inn[lp.header].level, max(leaving, default=self.out[lp.header].level)


def _pipelined(blocks: list[Block], lp: Loop) -> bool:
    waits = [ins for b in lp.body for ins in blocks[b].instrs
             if ins.op.startswith("cp.async.wait_group")]
    return bool(waits) and all(int(w.operands) > 0 for w in waits)


def _steady_trip(blocks, rpo, loops, lp: Loop, start: State) -> float:
    """Round trips per trip of lp's body in its steady state: TRIPS trips walked one after the
    other (each from the last one's latch state), the growth over the second half averaged."""
    s, levels = start.copy(), []
    for _ in range(TRIPS):
        w = _Walk(blocks, rpo, loops, lp.body, lp.header).run(s)
        s = w.out[lp.latches[0]]
        for x in lp.latches[1:]:
            s = s.join(w.out[x])
        s = s.copy()
        s.in_order()                                    # the back edge
        levels.append(s.level)
    half = TRIPS // 2
    return (levels[-1] - levels[half - 1]) / (TRIPS - half)


def _loop_chain(blocks, rpo, loops, lp: Loop, whole: _Walk, tile: int) -> LoopChain:
    """A loop's summary; a tile loop's trip is one tile's chain (not walked again)."""
    inner = not any(o.body < lp.body for o in loops)
    trip = _steady_trip(blocks, rpo, loops, lp, whole.inn[lp.header]) if inner else float(tile)
    mma = any(ins.op.startswith(("wgmma.mma_async", "mma.sync")) for b in lp.body
              for ins in blocks[b].instrs)
    return LoopChain(blocks[lp.header].label, trip, inner, _pipelined(blocks, lp), mma)


def _tile_end(walk: _Walk, region_loop: Loop | None) -> int:
    ends = (region_loop.latches if region_loop is not None else
            [b for b in walk.order if not walk.blocks[b].succs])
    return max(walk.out[b].level for b in ends if b in walk.out)


def analyze(name: str, blocks: list[Block]) -> Chain:
    """The Chain of one entry's blocks (the module docstring's definitions)."""
    rpo, loops = natural_loops(blocks)
    whole = _Walk(blocks, rpo, loops, set(rpo), -1).run(State())
    tile_loop = next((lp for lp in reversed(loops)
                      if any(o.body < lp.body for o in loops)), None)
    if tile_loop is None:
        walk, prologue = whole, 0
    else:
        walk = _Walk(blocks, rpo, loops, tile_loop.body, tile_loop.header).run(State())
        prologue = whole.inn[tile_loop.header].level
    inner = [lp for lp in walk.loops if not any(o.body < lp.body for o in loops)]
    tile = _tile_end(walk, tile_loop)
    if inner:
        first = min(inner, key=lambda lp: walk.order.index(lp.header))
        last = max(inner, key=lambda lp: walk.order.index(lp.header))
        before = walk.inn[first.header].level
        after = walk.exit_level(last)[1]
        tail = [b for b in walk.order if walk.order.index(b) > walk.order.index(last.header)
                and not any(b in lp.body for lp in inner)]
    else:
        before = after = 0
        tail = walk.order
    summary = tuple(_loop_chain(blocks, rpo, loops, lp, whole, tile) for lp in loops)
    ops = count_ops(ins for b in tail for ins in blocks[b].instrs)
    mmas = {ins.op.split(".")[0] for b in blocks for ins in b.instrs
            if ins.op.startswith(("mma.sync", "wgmma.mma_async"))}
    wgmma = lambda bs: sum(ins.op.startswith("wgmma.mma_async")  # noqa: E731
                           for b in bs for ins in blocks[b].instrs)
    in_loops = set().union(*(lp.body for lp in inner)) if inner else set()
    return Chain(name, tile, before, after - before, tile - after, prologue, summary, ops,
                 mma_sync=mmas == {"mma"},
                 wgmma_trip=max((wgmma(lp.body) for lp in inner), default=0),
                 wgmma_tail=wgmma(b for b in walk.order if b not in in_loops))


def chains_of_ptx(ptx: str) -> dict[str, Chain]:
    """entry name → its Chain, for every `.entry` of a PTX text."""
    return {name: analyze(name, blocks_of(body)) for name, body in entry_bodies(ptx).items()}


@lru_cache(maxsize=None)
def _file_chains(path: Path) -> dict[str, Chain]:
    return chains_of_ptx(path.read_text())


@lru_cache(maxsize=None)
def _manifest(d: Path) -> dict:
    try:
        return json.loads((d / "manifest.json").read_text())["kernels"]
    except FileNotFoundError:
        return {}


def chain_of(kernel: str, target: str = "sm_90a") -> Chain:
    """The Chain of a manifest key (e.g. "weight_grad_0bcdb623cf"), from whichever profile's
    kernels_ptx/<profile>/<target> holds it (a key is a digest of what was compiled)."""
    for d in sorted(PTX_DIR.glob(f"*/{target}")):
        rec = _manifest(d).get(kernel)
        if rec is not None:
            found = _file_chains(d / rec["file"])
            if rec["entry"] not in found:
                raise ValueError(f"{d / rec['file']}: no entry {rec['entry']!r} (manifest {kernel})")
            return found[rec["entry"]]
    raise KeyError(f"no PTX for kernel {kernel!r} under {PTX_DIR}/*/{target} "
                   "(rebuild it: python -m tools.build_ptx)")


def kernel_chains(profile_name: str, target: str) -> dict[str, Chain]:
    """manifest key → the Chain of its entry, for kernels_ptx/<profile>/<target>."""
    d = PTX_DIR / profile_name / target
    return {key: chain_of(key, target) for key in _manifest(d)}
