"""The bounds of one launch, in seconds, from its Work: tensor, other pipes, L2, HBM, mapped host
memory (pcie) and the serial chain of its programs placed on the SMs (the method: tools/cost/)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from tools.cost.inputs import (ALU_PER_CLK, BF16_FLOPS, CLOCK_HZ, DEP_OP_CYCLES, HBM_BW, HBM_LATENCY, L2_BW,
                     L2_LATENCY, L2_RESIDENT, MUFU_PER_CLK, PCIE_BW, PCIE_IN_FLIGHT, PCIE_LATENCY,
                     PHASE, SM_L2_BW, SMS, STAGING_CACHED)
from tools.cost.work import Programs, Step, Work, cdiv, lines


def step_time(st: Step, s: str) -> float:
    """One trip: optimistic — tensor, other pipes and memory overlap fully; central and
    pessimistic — memory overlaps compute (the loops prefetch: num_stages ≥ 2; the loads of a
    one-stage kernel are its trips' l2/hbm latencies) but MMA and elementwise work serialize
    (one warpgroup, dependent phases).  Latencies always add."""
    mma = st.mma_flops / (BF16_FLOPS[s] / SMS)
    pipes = st.mufu_ops / (MUFU_PER_CLK * CLOCK_HZ) + st.alu_ops / (ALU_PER_CLK * CLOCK_HZ)
    mem = (st.load_bytes + st.store_bytes) / SM_L2_BW[s]
    staging_lat = L2_LATENCY[s] if STAGING_CACHED[s] else PCIE_LATENCY[s]
    lat = (st.phases * PHASE[s] + st.serial_ops * DEP_OP_CYCLES[s] / CLOCK_HZ
           + st.l2_trips * L2_LATENCY[s] + st.hbm_trips * HBM_LATENCY[s]
           + st.staging_trips * staging_lat)
    if s == "optimistic":
        return max(mma, pipes, mem) + lat
    return max(mem, mma + pipes) + lat


def makespan(durations: list[float], slots: int) -> float:
    """Programs started in order on the first free slot (how blocks are dispatched)."""
    if len(set(durations)) == 1:
        return cdiv(len(durations), slots) * durations[0]
    heap = [0.0] * min(slots, len(durations))
    for d in durations:
        heapq.heappush(heap, heapq.heappop(heap) + d)
    return max(heap)


def durations(g: Programs, s: str) -> list[float]:
    trip, fixed = step_time(g.step, s), step_time(g.fixed, s)
    return [fixed + t * trip for t in g.trips]


def busiest_sm(per_program: list[float], sms: int = SMS) -> float:
    """The busiest SM's share of a throughput: ceil(P/sms) mean programs, or the largest one."""
    P = len(per_program)
    return max(cdiv(P, sms) * sum(per_program) / P, max(per_program))


@dataclass(frozen=True)
class PerProgram:
    """Per-program totals of a launch's Work, in blockIdx order."""
    flops: list[float]
    moved: list[float]             # bytes loaded + stored
    pipes_s: list[float]           # MUFU + ALU seconds on one SM

    @classmethod
    def of(cls, work: Work) -> "PerProgram":
        progs = [(g, t) for g in work.programs for t in g.trips]
        total = lambda f: [t * f(g.step) + f(g.fixed) for g, t in progs]  # noqa: E731
        return cls(total(lambda x: x.mma_flops), total(lambda x: x.load_bytes + x.store_bytes),
                   total(lambda x: x.mufu_ops / (MUFU_PER_CLK * CLOCK_HZ)
                         + x.alu_ops / (ALU_PER_CLK * CLOCK_HZ)))


def hbm_bytes(work: Work, s: str) -> float:
    """The launch's HBM bytes in scenario s: its unique bytes less the fresh ones still in L2."""
    return work.hbm_bytes - L2_RESIDENT[s] * work.fresh_bytes


def bounds(work: Work, per: PerProgram, per_sm: int, s: str, sms: int = SMS) -> dict[str, float]:
    """Seconds of each bound of one launch in scenario s, on `sms` SMs (fewer than the chip's
    while the update's side lane holds some: lanes.py).  The chip-wide L2, HBM and
    PCIe bandwidths are not divided here: the lane schedule shares them."""
    l2_bytes = sum(per.moved) + work.extra_l2_bytes
    cached = bool(STAGING_CACHED[s])
    read = sum(x.unique_bytes if cached else x.read_bytes for x in work.staging)
    requests = sum(lines(x.unique_bytes) if cached else x.read_requests for x in work.staging)
    written = sum(x.write_bytes for x in work.staging)
    pcie = max(read / PCIE_BW[s], requests * PCIE_LATENCY[s] / PCIE_IN_FLIGHT[s]) + written / PCIE_BW[s]
    return {"tensor": busiest_sm(per.flops, sms) / (BF16_FLOPS[s] / SMS),
            "pipes": busiest_sm(per.pipes_s, sms),
            "l2": max(l2_bytes / L2_BW[s], busiest_sm(per.moved, sms) / SM_L2_BW[s]),
            "hbm": hbm_bytes(work, s) / HBM_BW[s],
            "pcie": pcie,
            "serial": makespan([d for g in work.programs for d in durations(g, s)], sms * per_sm)}

