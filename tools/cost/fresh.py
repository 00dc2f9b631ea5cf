"""Bytes a launch reads that a launch it waits for has just written: L2 hits, not HBM reads.

A launch's reads and writes are plan/launches/regions.py's regions (exact, and tested against the
kernels).  For launch i and each launch j it waits for (`Submission.deps[i]`: its lane's previous
launch and the other lane's it is after), every byte of a read region of i inside a write region
of j is *fresh*: j wrote it a moment ago, so it is still in L2 while j's writes fit there —
all of them when j wrote at most L2_BYTES, else the fraction L2_BYTES / j's written bytes (the
last written stay).  The cost model charges the fresh bytes, times the scenario's L2_RESIDENT
fraction, to L2 instead of HBM (bounds.hbm_bytes).  Only the direct predecessors count: what
older launches left in L2 is not claimed.
"""
from __future__ import annotations

from coppelius.plan.launches.regions import STAGING, Region, RegionError, regions

from tools.cost.inputs import L2_BYTES


def _bytes(r: Region) -> float:
    return r.count * r.itemsize


def overlap(read: Region, write: Region) -> float:
    """Bytes of `read` inside `write` (same buffer): their byte spans' intersection, scaled by
    how densely each fills its span (a strided region touches only its runs)."""
    if read.space != write.space or read.space == STAGING:
        return 0.0
    (a0, an), (b0, bn) = read.byte_span(), write.byte_span()
    common = min(a0 + an, b0 + bn) - max(a0, b0)
    if common <= 0 or an <= 0 or bn <= 0:
        return 0.0
    return common * min(_bytes(read) / an, _bytes(write) / bn)


def fresh_of(reads, predecessors) -> float:
    """Bytes of `reads` (Regions) inside what the predecessors wrote: each predecessor a tuple of
    its write Regions, counted in full while they add up to at most L2_BYTES, else the fraction
    L2_BYTES / their bytes."""
    total = 0.0
    for read in reads:
        got = 0.0
        for writes in predecessors:
            written = sum(_bytes(w) for w in writes if w.space != STAGING)
            if written:
                got += sum(overlap(read, w) for w in writes) * min(1.0, L2_BYTES / written)
        total += min(got, _bytes(read))
    return total


def fresh_bytes(profile, sub) -> list[float]:
    """Per launch of submission `sub`: the bytes it reads that its predecessors just wrote and
    that fit in L2 (before the scenario's resident fraction)."""
    try:
        regs = [regions(profile, x) for x in sub.launches]
    except RegionError:
        return [0.0] * len(sub.launches)
    return [fresh_of(r.reads, [regs[j].writes for j in sub.deps[i]]) for i, r in enumerate(regs)]
