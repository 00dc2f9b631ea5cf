"""The bounds of one launch, in seconds, from its Work: tensor, other pipes, L2, HBM, mapped host
memory (pcie) and the serial chain of its programs placed on the SMs (the method: tools/cost/);
and its CTAs' phases as the block scheduler's replay runs them (sm_sim.py)."""
from __future__ import annotations

from dataclasses import dataclass

from tools.cost.inputs import (ALU_PER_CLK, BF16_FLOPS, CLOCK_HZ, DEP_OP_CYCLES, HBM_BW, HBM_LATENCY, L2_BW,
                     L2_LATENCY, L2_RESIDENT, MMA_SYNC_RATE, MUFU_PER_CLK, PCIE_BW, PCIE_IN_FLIGHT,
                     PCIE_LATENCY, PHASE, SM_L2_BW, SMS, STAGING_CACHED, WGMMA_SERIAL_CYCLES)
from tools.cost.sm_sim import Phase, alone, makespan
from tools.cost.work import Step, Work, cdiv, lines

__all__ = ["PerProgram", "bounds", "busiest_sm", "cta_phases", "hbm_bytes",
           "held_sms", "makespan", "pcie_time", "serial_time", "step_parts", "step_time"]


def mma_rate(st: Step, s: str) -> float:
    """The chip's MMA rate for a step's FLOPs in scenario s: BF16_FLOPS through wgmma, its
    MMA_SYNC_RATE share through mma.sync."""
    return BF16_FLOPS[s] * (MMA_SYNC_RATE[s] if st.mma_sync else 1.0)


def step_parts(st: Step, s: str) -> tuple[float, float]:
    """One trip as (throughput, latency) seconds, its time alone their sum.  Throughput: what
    the SM's tensor cores, other pipes and L1↔L2 path are busy with — optimistic, tensor, other
    pipes and memory overlap fully; central and pessimistic, memory overlaps compute (the loops
    prefetch: num_stages ≥ 2; the loads of a one-stage kernel are its trips' l2/hbm latencies)
    but MMA and elementwise work serialize (one warpgroup, dependent phases).  Latency: the
    dependent waits, which always add and leave the SM to the CTAs beside it (sm_sim.py)."""
    mma = st.mma_flops / (mma_rate(st, s) / SMS)
    pipes = st.mufu_ops / (MUFU_PER_CLK * CLOCK_HZ) + st.alu_ops / (ALU_PER_CLK * CLOCK_HZ)
    mem = (st.load_bytes + st.store_bytes) / SM_L2_BW[s]
    staging_lat = L2_LATENCY[s] if STAGING_CACHED[s] else PCIE_LATENCY[s]
    lat = (st.phases * PHASE[s] + st.serial_ops * DEP_OP_CYCLES[s] / CLOCK_HZ
           + st.serial_wgmma * WGMMA_SERIAL_CYCLES[s] / CLOCK_HZ
           + st.l2_trips * L2_LATENCY[s] + st.hbm_trips * HBM_LATENCY[s]
           + st.staging_trips * staging_lat)
    if s == "optimistic":
        return max(mma, pipes, mem), lat
    return max(mem, mma + pipes), lat


def step_time(st: Step, s: str) -> float:
    """One trip alone on an SM (step_parts, added)."""
    thr, lat = step_parts(st, s)
    return thr + lat


def hbm_bytes(work: Work, s: str) -> float:
    """The launch's HBM bytes in scenario s: its unique bytes less the fresh ones still in L2."""
    return work.hbm_bytes - L2_RESIDENT[s] * work.fresh_bytes


_PHASES: dict = {}      # (id(work), scenario, with_bytes) → (work, its cta_phases): the replay's
#                         variants and scenarios read each launch's phases many times


def _scenario_key(s: str) -> tuple:
    """A scenario as a cache key: its name and the inputs it moves (inputs.Scenario)."""
    return (str(s),) + tuple((id(r), end) for r, end in getattr(s, "moved", ()))


def cta_phases(work: Work, s: str, with_bytes: bool = True) -> tuple[tuple[Phase, ...], ...]:
    """_cta_phases, kept while `work` lives (the same tuple for the same launch and scenario)."""
    key = (id(work), _scenario_key(s), with_bytes)
    hit = _PHASES.get(key)
    if hit is not None and hit[0] is work:
        return hit[1]
    out = tuple(_cta_phases(work, s, with_bytes))
    if len(_PHASES) > 8192:
        _PHASES.clear()
    _PHASES[key] = (work, out)
    return out


def _cta_phases(work: Work, s: str, with_bytes: bool = True) -> list[tuple[Phase, ...]]:
    """Each program's phases in blockIdx order: its loop (trips × one trip), then its prologue
    and epilogue (Programs.fixed), each with the share of its SM it keeps busy alone (throughput
    over its time: step_parts) and its bytes.  L2: the phase's own loads and stores (a launch's
    extra_l2_bytes with its loops').  HBM: the epilogue's bytes are its own (each program's
    output and the state it updates: AdamW's P, M, V), up to the launch's HBM bytes, and the
    rest — the operands its programs share — the loops', each phase in proportion to its bytes.
    Programs of one group with the same trips share one tuple."""
    groups = []
    loop_l2 = fixed_l2 = 0.0
    for g in work.programs:
        (thr, lat), (fthr, flat) = step_parts(g.step, s), step_parts(g.fixed, s)
        moved = g.step.load_bytes + g.step.store_bytes
        fixed_moved = g.fixed.load_bytes + g.fixed.store_bytes
        groups.append((g, thr, lat, fthr, flat, moved, fixed_moved))
        loop_l2 += moved * sum(g.trips)
        fixed_l2 += fixed_moved * len(g.trips)
    total = max(0.0, hbm_bytes(work, s)) if with_bytes else 0.0
    hbm_fixed = min(fixed_l2, total)
    hbm_loop = total - hbm_fixed
    if not loop_l2:                                  # no loop bytes: all of it the epilogues'
        hbm_fixed, hbm_loop = total, 0.0
    extra = work.extra_l2_bytes / loop_l2 if loop_l2 else 0.0
    out = []
    for g, thr, lat, fthr, flat, moved, fixed_moved in groups:
        share = thr / (thr + lat) if thr + lat > 0 else 0.0
        fixed = ()
        if fthr + flat > 0:
            fixed = (Phase(fthr + flat, fthr / (fthr + flat),
                           hbm_fixed * fixed_moved / fixed_l2 if fixed_l2 else 0.0,
                           fixed_moved) if with_bytes else Phase(fthr + flat, fthr / (fthr + flat)),)
        made: dict[int, tuple] = {}
        for t in g.trips:
            cta = made.get(t)
            if cta is None:
                loop = ()
                if t * (thr + lat) > 0:
                    loop = ((Phase(t * (thr + lat), share,
                                   hbm_loop * t * moved / loop_l2 if loop_l2 else 0.0,
                                   t * moved * (1 + extra)) if with_bytes else
                             Phase(t * (thr + lat), share)),)
                cta = made[t] = (loop + fixed) or (Phase(0.0),)
            out.append(cta)
    return out


def held_sms(programs: int, per_sm: int, sms: int = SMS, pack: bool = False) -> int:
    """The SMs a grid of `programs` CTAs holds at once on `sms` free SMs: one CTA per SM first
    (the block scheduler's placement, sm_sim.py: min(programs, sms)), or, packed, as many on an
    SM as fit (`per_sm`) before the next (ceil(programs / per_sm), at most sms)."""
    return max(1, min(sms, cdiv(programs, per_sm) if pack else programs))


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
    sync_flops: list[float]        # of flops, those issued through mma.sync (Step.mma_sync)

    @classmethod
    def of(cls, work: Work) -> "PerProgram":
        progs = [(g, t) for g in work.programs for t in g.trips]
        total = lambda f: [t * f(g.step) + f(g.fixed) for g, t in progs]  # noqa: E731
        return cls(total(lambda x: x.mma_flops), total(lambda x: x.load_bytes + x.store_bytes),
                   total(lambda x: x.mufu_ops / (MUFU_PER_CLK * CLOCK_HZ)
                         + x.alu_ops / (ALU_PER_CLK * CLOCK_HZ)),
                   total(lambda x: x.mma_flops if x.mma_sync else 0.0))

    def tensor_s(self, s: str) -> list[float]:
        """Each program's seconds of one SM's tensor cores in scenario s (mma_rate)."""
        sm = BF16_FLOPS[s] / SMS
        return [(f - sf) / sm + sf / (sm * MMA_SYNC_RATE[s])
                for f, sf in zip(self.flops, self.sync_flops)]


def pcie_time(work: Work, s: str) -> float:
    """Seconds of the launch's mapped-host-memory traffic: its reads (bytes over PCIE_BW, or
    requests × PCIE_LATENCY over PCIE_IN_FLIGHT, whichever is longer) and writes."""
    cached = bool(STAGING_CACHED[s])
    read = sum(x.unique_bytes if cached else x.read_bytes for x in work.staging)
    requests = sum(lines(x.unique_bytes) if cached else x.read_requests for x in work.staging)
    written = sum(x.write_bytes for x in work.staging)
    return max(read / PCIE_BW[s], requests * PCIE_LATENCY[s] / PCIE_IN_FLIGHT[s]) + written / PCIE_BW[s]


def serial_time(work: Work, per_sm: int, s: str, sms: int = SMS, pack: bool = False) -> float:
    """The programs' phases placed on the SMs, co-resident CTAs sharing their SM, no bandwidth
    limit (sm_sim.alone: CTAs released together with the same work run in step, K loops
    together, then epilogues together)."""
    return alone(cta_phases(work, s, with_bytes=False), per_sm, sms, pack)


def bounds(work: Work, per: PerProgram, per_sm: int, s: str, sms: int = SMS,
           pack: bool = False) -> dict[str, float]:
    """Seconds of each bound of one launch in scenario s, on `sms` free SMs.  Tensor, other pipes
    and one SM's L2 path: the busiest of the SMs the grid holds (held_sms: k CTAs on one SM
    share its rates).  L2 and HBM: all its bytes at the chip's bandwidth, as if spread evenly
    over its time.  Serial: serial_time.  Replay: the grid alone as the block scheduler's
    replay runs it (sm_sim.py) — serial, with each phase asking L2 and HBM for its own bytes, so
    CTAs whose K loops (or epilogues) run in step ask for them together; at least the serial,
    L2 and HBM terms, and longer where a phase's bytes outrun the chip."""
    l2_bytes = sum(per.moved) + work.extra_l2_bytes
    held = held_sms(len(per.flops), per_sm, sms, pack)
    return {"tensor": busiest_sm(per.tensor_s(s), held),
            "pipes": busiest_sm(per.pipes_s, held),
            "l2": max(l2_bytes / L2_BW[s], busiest_sm(per.moved, held) / SM_L2_BW[s]),
            "hbm": hbm_bytes(work, s) / HBM_BW[s],
            "pcie": pcie_time(work, s),
            "serial": serial_time(work, per_sm, s, sms, pack),
            "replay": alone(cta_phases(work, s), per_sm, sms, pack, HBM_BW[s], L2_BW[s])}
