"""Each launch alone on the whole chip: its figures, every bound in every scenario, the one that
binds, and its time with the launch cost (`model` over a submission's launch list)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from coppelius.staging.errors import UserError
from coppelius.plan import launches  # plain data: no Triton here
from coppelius.plan.buffers import buffers
from coppelius.plan.launches.graph import programmatic

from tools.cost.bounds import PerProgram, bounds
from tools.cost.fresh import fresh_bytes
from tools.cost.inputs import LAUNCH, SCENARIOS, SMS
from tools.cost.kernel_stats import KernelStats, occupancy
from tools.cost.kernels import REGISTRY
from tools.cost.ptx_chain import chain_of
from tools.cost.work import View, Work, cdiv

TIE = 1e-9        # relative: bounds this close are the same figure, its name the first's


@dataclass
class LaunchCost:
    label: str
    kernel: str
    function: str
    bucket: str
    grid: tuple[int, int, int]
    programs: int
    threads: int
    regs: int
    smem: int
    spill: int
    per_sm: int
    occupancy_limit: str
    rounds: int
    programs_per_sm: int
    flops: float
    l2_bytes: float
    hbm_bytes: float
    staging_read_bytes: float
    staging_requests: int
    staging_write_bytes: float
    serial_iterations: int
    programmatic: bool = False     # its edge to its lane's previous launch is (lanes.py)
    fresh_bytes: float = 0.0       # read just after a predecessor wrote them (fresh.py)
    round_trips: dict = field(default_factory=dict)    # the PTX's chain (ptx_chain.Chain)
    bounds_us: dict = field(default_factory=dict)      # term → {scenario: µs}
    binding: dict = field(default_factory=dict)        # scenario → term
    us: dict = field(default_factory=dict)             # scenario → µs (with the launch cost)
    work: Work | None = field(default=None, repr=False, compare=False)  # for the lane schedule


def bucket(launch) -> str:
    """The report's grouping: the kernel family, matmuls by stage (today's table)."""
    if launch.function != "matmul":
        return launch.function
    label = launch.label
    return "matmul " + (label.split(".", 2)[-1] if label.startswith("layers") else label)


def work_of(launch, bufs, target: str = "sm_90a", fresh: float = 0.0) -> Work:
    """The registry entry's description of a launch (with its kernel's PTX round trips, and the
    `fresh` bytes it reads that its predecessor just wrote), checked against the launch itself."""
    fam = REGISTRY.get(launch.function)
    if fam is None:
        raise KeyError(f"{launch.label}: no cost-model entry for kernel function {launch.function!r} "
                       f"(add one to its family module, tools/cost/kernels_*.py; known: {sorted(REGISTRY)})")
    v = View(launch, bufs, chain_of(launch.kernel, target))
    work = fam(v)
    if v.chain.mma_sync:                # every step's MMAs at mma.sync's rate (bounds.mma_rate)
        work = _with_steps(work, {"mma_sync": True}, {"mma_sync": True})
    if fresh:
        work = dataclasses.replace(work, fresh_bytes=min(fresh, work.hbm_bytes))
    described = sum(len(g.trips) for g in work.programs)
    if described != v.programs:
        raise ValueError(f"{launch.label}: the model describes {described} programs, the grid "
                         f"{launch.grid} has {v.programs}")
    accounted = {s.arg for s in work.staging}
    if accounted != v.staging_args():
        raise ValueError(f"{launch.label}: staging arguments {sorted(v.staging_args())}, the "
                         f"{launch.function} entry accounts for {sorted(accounted)}")
    return work


def _with_steps(work: Work, step: dict, fixed: dict) -> Work:
    """`work` with the fields `step` set on every loop trip and `fixed` on every prologue/epilogue."""
    return dataclasses.replace(work, programs=tuple(
        dataclasses.replace(g, step=dataclasses.replace(g.step, **step),
                            fixed=dataclasses.replace(g.fixed, **fixed))
        for g in work.programs))


def serialize_wgmma(work: Work, chain) -> Work:
    """The work of a kernel whose wgmmas ptxas serialized: each trip waits WGMMA_SERIAL_CYCLES
    for each of its loop's wgmmas, the prologue/epilogue for each of the tile's others."""
    return _with_steps(work, {"serial_wgmma": chain.wgmma_trip},
                       {"serial_wgmma": chain.wgmma_tail})


def chain_row(chain) -> dict:
    """The PTX's round trips of a kernel, as the report shows them."""
    return {"tile": chain.tile, "fill": chain.fill, "epilogue": chain.epilogue,
            "prologue": chain.prologue, "per_trip": chain.per_trip,
            "epilogue_slots": chain.ops.alu + chain.ops.mufu, "epilogue_mufu": chain.ops.mufu,
            "epilogue_barriers": chain.ops.bars}


def cost(launch, bufs, stats: dict[str, KernelStats], target: str = "sm_90a",
         fresh: float = 0.0) -> LaunchCost:
    """One launch: its figures, every bound in every scenario, the binding term, the totals."""
    if launch.kernel not in stats:
        raise KeyError(f"{launch.label}: no ptxas figures for {launch.kernel} (rebuild the PTX)")
    work = work_of(launch, bufs, target, fresh)
    st = stats[launch.kernel]
    if st.wgmma_serialized:
        work = serialize_wgmma(work, chain_of(launch.kernel, target))
    per_sm, limiter = occupancy(st)
    per = PerProgram.of(work)
    P = len(per.flops)
    c = LaunchCost(launch.label, launch.kernel, launch.function, bucket(launch), tuple(launch.grid),
                   P, st.threads, st.regs, st.shared, st.spill, per_sm, limiter,
                   rounds=cdiv(P, SMS * per_sm), programs_per_sm=cdiv(P, SMS), flops=sum(per.flops),
                   l2_bytes=sum(per.moved) + work.extra_l2_bytes, hbm_bytes=work.hbm_bytes,
                   staging_read_bytes=sum(x.read_bytes for x in work.staging),
                   staging_requests=sum(x.read_requests for x in work.staging),
                   staging_write_bytes=sum(x.write_bytes for x in work.staging),
                   serial_iterations=max(max(g.trips) for g in work.programs),
                   fresh_bytes=work.fresh_bytes,
                   round_trips=chain_row(chain_of(launch.kernel, target)), work=work)
    for s in SCENARIOS:
        _score(c, per, s)
    return c


def _score(c: LaunchCost, per: PerProgram, s: str) -> None:
    """Launch c's bounds, binding term and time in scenario s, into its tables under s."""
    terms = bounds(c.work, per, c.per_sm, s)
    top = max(terms.values())
    # the first term (bounds' order) within rounding of the largest: the replay of a launch
    # that one bandwidth binds throughout equals that bandwidth's term, less the float noise
    bind = next(k for k, x in terms.items() if x >= top * (1 - TIE))
    for k, x in terms.items():
        c.bounds_us.setdefault(k, {})[s] = x * 1e6
    c.binding[s] = bind
    c.us[s] = (top + LAUNCH[s]) * 1e6


def model(profile, submission: str, stats: dict[str, KernelStats],
          target: str = "sm_90a") -> list[LaunchCost]:
    subs = {s.name: s for s in launches.submissions(profile)}
    if submission not in subs:
        raise UserError(f"unknown submission {submission!r}", f"one of {', '.join(subs)}")
    bufs = buffers(profile)
    sub = subs[submission]
    costs = [cost(launch, bufs, stats, target, f)
             for launch, f in zip(sub.launches, fresh_bytes(profile, sub))]
    # an edge is programmatic where the plan allows it and the kernel was built to wait first
    for c, launch, allowed in zip(costs, sub.launches, programmatic(sub.launches)):
        c.programmatic = allowed and stats[launch.kernel].pdl
    return costs
