"""H200 cost model of a launch list (issue 14): per launch, the largest of its tensor, SM-pipe, L2,
HBM, mapped-host-memory and serial-chain times, plus a launch cost, in three scenarios.

  .venv/bin/python tools/build_ptx.py --report [--json] [--measured FILE]
  .venv/bin/python tools/cost_model.py [--profile P] [--submission forward|update|final] [--json]
                                       [--measured FILE]

A launch is costed from what the plan says it does (`launches.submissions(profile)`: grid,
arguments, constexprs, warps) and what ptxas says it needs (registers; shared memory from the
manifest), so no GPU is needed.  Each kernel family (REGISTRY, keyed by the Triton function name)
describes its programs: how many loop trips each makes, what one trip and the prologue/epilogue do
(MMA FLOPs, bytes loaded and stored, MUFU and ALU operations, dependent waits), the unique HBM
bytes of the launch, and what it reads or writes in mapped host memory (staging).  From that:

  tensor  = ceil(P / 132) · FLOPs per program / (bf16 rate / 132)  — the busiest SM's MMA work
            (or the largest program's).  k programs resident per SM share its tensor cores, so
            this is rounds = ceil(P / (132·k)) rounds of k·FLOPs per SM, except that a last
            partial round — or a grid under 132·k — is charged only the programs the busiest
            SM really gets.
  pipes   = the same for the MUFU and ALU work (exp, division, compares): the SM's other pipes.
  l2      = every byte every program loads or stores / L2 bandwidth, and at least the busiest
            SM's bytes over one SM's L2 path.
  hbm     = unique bytes read + written / HBM bandwidth.
  pcie    = staging reads (bytes / PCIe bandwidth, or requests · latency / requests in flight,
            whichever is larger) + staging writes / bandwidth.
  serial  = programs placed greedily, in blockIdx order, on 132·k slots (k from registers,
            shared memory, threads, blocks per SM); each lasts prologue/epilogue + trips × one
            trip, its parts overlapped as the scenario says.  The longest program's chain and
            wave quantization both show here.
  launch  = max(the bounds above) + the launch cost inside a graph.

Every input is a named constant in tools/cost_inputs.py with its source (a datasheet, a
measurement in /work/.library/device/KINDS.md, or a stated assumption); what each kernel does is
in the family modules tools/cost_kernels_*.py (gathered by tools/cost_kernels.py).  No figure here
was measured on a GPU: the device check's per-launch table (`--measured`) is what calibrates them.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from cost_inputs import (ALU_PER_CLK, BF16_FLOPS, BLOCKS_PER_SM, CLOCK_HZ, DEP_OP_CYCLES,  # noqa: E402
                         HBM_BW, HBM_LATENCY, INPUTS, L2_BW, L2_LATENCY, LAUNCH, LAUNCH_PDL, MUFU_PER_CLK,
                         PCIE_BW, PCIE_IN_FLIGHT, PCIE_LATENCY, PHASE, REG_ALLOC_UNIT, REGS_PER_SM,
                         SCENARIOS, SM_L2_BW, SMEM_ALLOC_UNIT, SMEM_PER_BLOCK, SMEM_PER_SM,
                         SMEM_RESERVED, SMS, STAGING_CACHED, SUBPARTITIONS, THREADS_PER_SM)
from cost_kernels import REGISTRY, Programs, Step, View, Work, cdiv, lines  # noqa: E402
from host.errors import UserError  # noqa: E402
from plan import launches, profiles  # noqa: E402  (plain data: no Triton here)
from plan.launch_graph import programmatic  # noqa: E402
from plan.buffers import buffers  # noqa: E402

PTX_DIR = ROOT / "kernels_ptx"

# ================================================================ occupancy and ptxas

@dataclass(frozen=True)
class KernelStats:
    regs: int
    shared: int                    # dynamic shared memory bytes (the manifest's "shared")
    threads: int
    spill: int = 0
    pdl: bool = False              # waits for its predecessor first (manifest "pdl": sm_90a)


def occupancy(stats: KernelStats) -> tuple[int, str]:
    """(programs resident per SM, the resource that limits it), as the occupancy calculator."""
    if stats.shared > SMEM_PER_BLOCK:
        raise ValueError(f"{stats.shared} B of shared memory exceed the {SMEM_PER_BLOCK} B per block")
    warps = cdiv(stats.threads, 32)
    regs_warp = cdiv(max(stats.regs, 1) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    warps_by_regs = (REGS_PER_SM // SUBPARTITIONS // regs_warp) * SUBPARTITIONS
    smem = cdiv(stats.shared, SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT + SMEM_RESERVED
    limits = {"registers": warps_by_regs // warps, "threads": THREADS_PER_SM // (warps * 32),
              "shared": SMEM_PER_SM // smem, "blocks": BLOCKS_PER_SM}
    limiter = min(limits, key=lambda k: limits[k])
    if limits[limiter] < 1:
        raise ValueError(f"a block of {stats.threads} threads × {stats.regs} registers does not fit an SM")
    return limits[limiter], limiter


def _ptxas() -> str:
    for cand in (shutil.which("ptxas"), "/usr/local/bin/ptxas", "/usr/local/cuda/bin/ptxas"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise UserError("no ptxas on this machine: the cost model reads registers from `ptxas -v`",
                    "install the CUDA toolkit's ptxas or put it on PATH")


def ptxas_stats(profile_name: str, target: str) -> dict[str, KernelStats]:
    """`ptxas -v` on every committed PTX file of kernels_ptx/<profile>/<target>: entry → stats."""
    d = PTX_DIR / profile_name / target
    try:
        m = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise UserError(f"{d / 'manifest.json'} is missing", "run tools/build_ptx.py") from None
    ptxas = _ptxas()
    out = {}
    for entry, rec in m["kernels"].items():
        r = subprocess.run([ptxas, f"-arch={target}", "-v", str(d / rec["file"]), "-o", os.devnull],
                           capture_output=True, text=True)
        regs = re.findall(r"Used (\d+) registers", r.stderr)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        if r.returncode != 0 or not regs:
            raise UserError(f"ptxas -v failed on {d / rec['file']}: {r.stderr.strip()[:200]}",
                            "rebuild the PTX with tools/build_ptx.py")
        out[entry] = KernelStats(int(regs[-1]), rec["shared"], rec["threads"],
                                 sum(int(x) + int(y) for x, y in spill), bool(rec.get("pdl")))
    return out


# ================================================================ the bounds

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


def _durations(g: Programs, s: str) -> list[float]:
    trip, fixed = step_time(g.step, s), step_time(g.fixed, s)
    return [fixed + t * trip for t in g.trips]


def _busiest_sm(per_program: list[float], sms: int = SMS) -> float:
    """The busiest SM's share of a throughput: ceil(P/sms) mean programs, or the largest one."""
    P = len(per_program)
    return max(cdiv(P, sms) * sum(per_program) / P, max(per_program))


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
    programmatic: bool = False     # its edge to its lane's previous launch is (cost_lanes.py)
    bounds_us: dict = field(default_factory=dict)      # term → {scenario: µs}
    binding: dict = field(default_factory=dict)        # scenario → term
    us: dict = field(default_factory=dict)             # scenario → µs (with the launch cost)


def bucket(launch) -> str:
    """The report's grouping: the kernel family, matmuls by stage (today's table)."""
    if launch.function != "matmul":
        return launch.function
    label = launch.label
    return "matmul " + (label.split(".", 2)[-1] if label.startswith("layers") else label)


def work_of(launch, bufs) -> Work:
    """The registry entry's description of a launch, checked against the launch itself."""
    fam = REGISTRY.get(launch.function)
    if fam is None:
        raise KeyError(f"{launch.label}: no cost-model entry for kernel function {launch.function!r} "
                       f"(add one to its family module, tools/cost_kernels_*.py; known: {sorted(REGISTRY)})")
    v = View(launch, bufs)
    work = fam(v)
    described = sum(len(g.trips) for g in work.programs)
    if described != v.programs:
        raise ValueError(f"{launch.label}: the model describes {described} programs, the grid "
                         f"{launch.grid} has {v.programs}")
    accounted = {s.arg for s in work.staging}
    if accounted != v.staging_args():
        raise ValueError(f"{launch.label}: staging arguments {sorted(v.staging_args())}, the "
                         f"{launch.function} entry accounts for {sorted(accounted)}")
    return work


@dataclass(frozen=True)
class _Per:
    """Per-program totals of a launch's Work, in blockIdx order."""
    flops: list[float]
    moved: list[float]             # bytes loaded + stored
    pipes_s: list[float]           # MUFU + ALU seconds on one SM

    @classmethod
    def of(cls, work: Work) -> "_Per":
        progs = [(g, t) for g in work.programs for t in g.trips]
        total = lambda f: [t * f(g.step) + f(g.fixed) for g, t in progs]  # noqa: E731
        return cls(total(lambda x: x.mma_flops), total(lambda x: x.load_bytes + x.store_bytes),
                   total(lambda x: x.mufu_ops / (MUFU_PER_CLK * CLOCK_HZ)
                         + x.alu_ops / (ALU_PER_CLK * CLOCK_HZ)))


def bounds(work: Work, per: _Per, per_sm: int, s: str, sms: int = SMS) -> dict[str, float]:
    """Seconds of each bound of one launch in scenario s, on `sms` SMs (fewer than the chip's
    while the update's side lane holds some: tools/cost_lanes.py).  The chip-wide L2, HBM and
    PCIe bandwidths are not divided here: the lane schedule shares them."""
    l2_bytes = sum(per.moved) + work.extra_l2_bytes
    cached = bool(STAGING_CACHED[s])
    read = sum(x.unique_bytes if cached else x.read_bytes for x in work.staging)
    requests = sum(lines(x.unique_bytes) if cached else x.read_requests for x in work.staging)
    written = sum(x.write_bytes for x in work.staging)
    pcie = max(read / PCIE_BW[s], requests * PCIE_LATENCY[s] / PCIE_IN_FLIGHT[s]) + written / PCIE_BW[s]
    return {"tensor": _busiest_sm(per.flops, sms) / (BF16_FLOPS[s] / SMS),
            "pipes": _busiest_sm(per.pipes_s, sms),
            "l2": max(l2_bytes / L2_BW[s], _busiest_sm(per.moved, sms) / SM_L2_BW[s]),
            "hbm": work.hbm_bytes / HBM_BW[s],
            "pcie": pcie,
            "serial": makespan([d for g in work.programs for d in _durations(g, s)], sms * per_sm)}


def cost(launch, bufs, stats: dict[str, KernelStats]) -> LaunchCost:
    """One launch: its figures, every bound in every scenario, the binding term, the totals."""
    if launch.kernel not in stats:
        raise KeyError(f"{launch.label}: no ptxas figures for {launch.kernel} (rebuild the PTX)")
    work = work_of(launch, bufs)
    st = stats[launch.kernel]
    per_sm, limiter = occupancy(st)
    per = _Per.of(work)
    P = len(per.flops)
    c = LaunchCost(launch.label, launch.kernel, launch.function, bucket(launch), tuple(launch.grid),
                   P, st.threads, st.regs, st.shared, st.spill, per_sm, limiter,
                   rounds=cdiv(P, SMS * per_sm), programs_per_sm=cdiv(P, SMS), flops=sum(per.flops),
                   l2_bytes=sum(per.moved) + work.extra_l2_bytes, hbm_bytes=work.hbm_bytes,
                   staging_read_bytes=sum(x.read_bytes for x in work.staging),
                   staging_requests=sum(x.read_requests for x in work.staging),
                   staging_write_bytes=sum(x.write_bytes for x in work.staging),
                   serial_iterations=max(max(g.trips) for g in work.programs))
    for s in SCENARIOS:
        terms = bounds(work, per, per_sm, s)
        bind = max(terms, key=terms.get)
        for k, x in terms.items():
            c.bounds_us.setdefault(k, {})[s] = x * 1e6
        c.binding[s] = bind
        c.us[s] = (terms[bind] + LAUNCH[s]) * 1e6
    return c


def model(profile, submission: str, stats: dict[str, KernelStats]) -> list[LaunchCost]:
    subs = {s.name: s for s in launches.submissions(profile)}
    if submission not in subs:
        raise UserError(f"unknown submission {submission!r}", f"one of {', '.join(subs)}")
    bufs = buffers(profile)
    sub = subs[submission]
    costs = [cost(launch, bufs, stats) for launch in sub.launches]
    # an edge is programmatic where the plan allows it and the kernel was built to wait first
    for c, launch, allowed in zip(costs, sub.launches, programmatic(sub.launches)):
        c.programmatic = allowed and stats[launch.kernel].pdl
    return costs


# ================================================================ output

def _totals(costs) -> dict[str, float]:
    return {s: sum(c.us[s] for c in costs) for s in SCENARIOS}


def buckets(costs) -> list[dict]:
    groups: dict[str, list[LaunchCost]] = {}
    for c in costs:
        groups.setdefault(c.bucket, []).append(c)
    rows = []
    for name, cs in groups.items():
        binds = {}
        for c in cs:
            binds[c.binding["central"]] = binds.get(c.binding["central"], 0) + 1
        rows.append({"bucket": name, "n": len(cs), "kernel": cs[0].kernel, "regs": cs[0].regs,
                     "smem": cs[0].smem, "per_sm": cs[0].per_sm, "rounds": cs[0].rounds,
                     "flops": sum(c.flops for c in cs), "l2_bytes": sum(c.l2_bytes for c in cs),
                     "hbm_bytes": sum(c.hbm_bytes for c in cs),
                     "staging_bytes": sum(c.staging_read_bytes + c.staging_write_bytes for c in cs),
                     "binding": max(binds, key=binds.get), "us": _totals(cs)})
    return sorted(rows, key=lambda r: -r["us"]["central"])


def where_time_goes(costs, s: str = "central") -> dict[str, float]:
    """µs of the summed estimate by binding term, the launch costs apart."""
    out = {"launch": 0.0}
    for c in costs:
        out[c.binding[s]] = out.get(c.binding[s], 0.0) + c.bounds_us[c.binding[s]][s]
        out["launch"] += LAUNCH[s] * 1e6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def floors(costs, lanes_of) -> dict[str, dict[str, float]]:
    """Per scenario, µs: what no schedule of these launches beats — every FLOP at the chip's bf16
    rate, every L2 byte at L2_BW, every HBM byte at HBM_BW (perfect overlap, no tail), and the
    launch costs of the longest lane (its launches run one after another; LAUNCH_PDL for an
    edge that is programmatic, LAUNCH for the others).  The graph's time is at
    least the largest (the lane model shares L2 and HBM bandwidth and never lends SMs): a plan
    whose largest floor exceeds a goal cannot meet it by scheduling, only by moving fewer bytes."""
    def launch_costs(lane, s):
        return sum(LAUNCH_PDL[s] if c.programmatic else LAUNCH[s] for c in costs
                   if lanes_of[c.label] == lane)
    flops = sum(c.flops for c in costs)
    l2 = sum(c.l2_bytes for c in costs)
    hbm = sum(c.hbm_bytes for c in costs)
    return {s: {"tensor": flops / BF16_FLOPS[s] * 1e6, "l2": l2 / L2_BW[s] * 1e6,
                "hbm": hbm / HBM_BW[s] * 1e6,
                "launches": max(launch_costs(lane, s) for lane in set(lanes_of.values())) * 1e6}
            for s in SCENARIOS}


def _lanes_of(profile, submission: str) -> dict[str, int]:
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    return {x.label: x.lane for x in sub.launches}


def lanes(profile, submission: str, costs) -> dict:
    """The submission's graph replayed on two lanes (tools/cost_lanes.py), per scenario."""
    import cost_lanes
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    return cost_lanes.lane_summary(sub, costs, buffers(profile))


def to_json(costs, profile_name: str, target: str, submission: str, lane: dict,
            floor: dict) -> dict:
    """`<submission>_us`: the graph's time on two lanes; `serial_sum_us`: every launch alone, one
    after another (what the buckets and where_us add up to); `floors_us`: what no schedule of
    these launches beats (`floors`)."""
    return {"profile": profile_name, "target": target, "submission": submission,
            "launches": len(costs),
            f"{submission}_us": {s: lane[s]["graph_us"] for s in SCENARIOS},
            "serial_sum_us": _totals(costs), "lanes": lane, "floors_us": floor,
            "where_us": {s: where_time_goes(costs, s) for s in SCENARIOS},
            "buckets": buckets(costs), "per_launch": [asdict(c) for c in costs],
            "inputs": {k: asdict(r) for k, r in INPUTS.items()}}


def _f(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def table(costs, profile_name: str, target: str, submission: str, lane: dict,
          floor: dict) -> str:
    tot = _totals(costs)
    out = [f"H200 cost model: {submission} submission, {profile_name}, {target} — "
           f"{len(costs)} launches (a prediction: nothing here was measured on a GPU)", "",
           "| bucket | n | regs | smem KB | per SM | rounds | GFLOP | L2 MB | HBM MB | PCIe MB | "
           "binds | optimistic µs | central µs | pessimistic µs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in buckets(costs):
        out.append(f"| {r['bucket']} | {r['n']} | {r['regs']} | {r['smem'] / 1024:.0f} | {r['per_sm']} | "
                   f"{r['rounds']} | {r['flops'] / 1e9:.1f} | {r['l2_bytes'] / 1e6:.0f} | "
                   f"{r['hbm_bytes'] / 1e6:.0f} | {r['staging_bytes'] / 1e6:.2f} | {r['binding']} | "
                   + " | ".join(_f(r["us"][s]) for s in SCENARIOS) + " |")
    out.append(f"| **total** | {len(costs)} | | | | | {sum(c.flops for c in costs) / 1e9:.1f} | "
               f"{sum(c.l2_bytes for c in costs) / 1e6:.0f} | {sum(c.hbm_bytes for c in costs) / 1e6:.0f} | "
               f"{sum(c.staging_read_bytes + c.staging_write_bytes for c in costs) / 1e6:.2f} | | "
               + " | ".join(f"**{tot[s]:.0f}**" for s in SCENARIOS) + " |")
    out.append("| **graph, two lanes** (tools/cost_lanes.py) | | | | | | | | | | | "
               + " | ".join(f"**{lane[s]['graph_us']:.0f}**" for s in SCENARIOS) + " |")
    c = lane["central"]
    out += ["", "Two lanes (central): the main lane's launches alone "
            f"{c['main_lane_alone_us']:.0f} µs, the side lane's (weight gradients + AdamW) "
            f"alone {c['side_lane_alone_us']:.0f} µs; "
            f"replayed together the main lane is busy {c['main_lane_busy_us']:.0f} µs, the side "
            f"lane {c['side_lane_busy_us']:.0f} µs, both working {c['both_working_us']:.0f} µs; "
            f"the graph ends at {c['graph_us']:.0f} µs (the total row above is every launch "
            "alone, one after another)."]
    out += ["", f"Programmatic edges (plan/launch_graph.programmatic, on kernels built to wait): "
            f"{c['programmatic_edges']} of {len(costs)} launches follow their lane's previous "
            f"launch programmatically and pay LAUNCH_PDL ({LAUNCH_PDL['central'] * 1e6:.1f} µs "
            f"central) instead of LAUNCH ({LAUNCH['central'] * 1e6:.1f}) when that launch is the "
            "last of their predecessors to finish; with every edge full the graph would end at "
            + " / ".join(f"{lane[s]['full_edges_graph_us']:.0f}" for s in SCENARIOS)
            + " µs (optimistic / central / pessimistic)."]
    f = floor["central"]
    top = max(f, key=f.get)
    out += ["", "Floors (central; no schedule of these launches beats them): "
            f"L2 {f['l2']:.0f} µs ({sum(x.l2_bytes for x in costs) / 1e6:,.0f} MB at "
            f"{L2_BW['central'] / 1e12:.1f} TB/s), HBM {f['hbm']:.0f} µs "
            f"({sum(x.hbm_bytes for x in costs) / 1e6:,.0f} MB at {HBM_BW['central'] / 1e12:.1f} TB/s), "
            f"tensor {f['tensor']:.0f} µs ({sum(x.flops for x in costs) / 1e9:.1f} GFLOP at "
            f"{BF16_FLOPS['central'] / 1e12:.0f} TFLOP/s), the longest lane's launch costs "
            f"{f['launches']:.0f} µs; the graph is {c['graph_us'] / f[top]:.2f}× its largest "
            f"({top})."]
    w = where_time_goes(costs)
    out += ["", "Where the central estimate goes (µs, by each launch's binding term): "
            + ", ".join(f"{k} {v:.0f}" for k, v in w.items()) + "."]
    staged = [c for c in costs if c.staging_read_bytes]
    if staged:
        out.append("Mapped host memory read by: " + "; ".join(
            f"{c.label} {c.staging_read_bytes:,.0f} B in {c.staging_requests:,} requests "
            f"({c.bounds_us['pcie']['central']:.1f} µs central, "
            f"{c.bounds_us['pcie']['pessimistic']:.1f} pessimistic)" for c in staged) + ".")
    return "\n".join(out)


# ================================================================ calibration against a measurement

def read_measured(path: Path) -> list[dict]:
    """The device check's per-launch table: a JSON list of {label, kernel, us}."""
    try:
        rows = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file", "give the device check's per-launch JSON") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not JSON ({e})", "a list of {label, kernel, us} objects") from None
    if not isinstance(rows, list):
        raise UserError(f"{path}: top level is {type(rows).__name__}, not a list",
                        "a list of {label, kernel, us} objects")
    for i, r in enumerate(rows):
        for key, kind in (("label", str), ("kernel", str), ("us", (int, float))):
            if not isinstance(r, dict) or not isinstance(r.get(key), kind) or isinstance(r.get(key), bool):
                raise UserError(f"{path}: entry {i} has no valid {key!r}",
                                "each entry is {\"label\": str, \"kernel\": str, \"us\": number}")
        if not r["us"] >= 0 or math.isinf(r["us"]):
            raise UserError(f"{path}: entry {i} ({r['label']}) has us = {r['us']}", "a time ≥ 0 in µs")
    return rows


def compare(costs, measured: list[dict]) -> str:
    """Model vs measured per launch and per bucket; refuses a table of another launch list."""
    by_label = {c.label: c for c in costs}
    seen = set()
    for r in measured:
        c = by_label.get(r["label"])
        if c is None:
            raise UserError(f"measured launch {r['label']!r} is not in the modelled list",
                            "measure the same profile and submission as the model")
        if c.kernel != r["kernel"]:
            raise UserError(f"measured {r['label']} ran {r['kernel']}, the model's is {c.kernel}",
                            "the measured table comes from another build of the PTX")
        if r["label"] in seen:
            raise UserError(f"launch {r['label']!r} measured twice", "one entry per launch")
        seen.add(r["label"])
    got = {r["label"]: float(r["us"]) for r in measured}
    out = ["| launch | function | binds | optimistic µs | central µs | pessimistic µs | measured µs | "
           "measured / central | in range |", "|---|---|---|---|---|---|---|---|---|"]
    for c in costs:
        if c.label not in got:
            continue
        m = got[c.label]
        inside = c.us["optimistic"] <= m <= c.us["pessimistic"]
        out.append(f"| {c.label} | {c.function} | {c.binding['central']} | "
                   + " | ".join(_f(c.us[s]) for s in SCENARIOS)
                   + f" | {_f(m)} | {m / c.us['central']:.2f} | {'yes' if inside else 'NO'} |")
    out += ["", "| bucket | measured / n | central µs | measured µs | measured / central |",
            "|---|---|---|---|---|"]
    groups: dict[str, list[LaunchCost]] = {}
    for c in costs:
        groups.setdefault(c.bucket, []).append(c)
    sums = []
    for name, cs in groups.items():
        hit = [c for c in cs if c.label in got]
        if hit:
            model_us = sum(c.us["central"] for c in hit)
            meas_us = sum(got[c.label] for c in hit)
            sums.append((name, len(hit), len(cs), model_us, meas_us))
    for name, k, n, model_us, meas_us in sorted(sums, key=lambda r: -r[4]):
        out.append(f"| {name} | {k}/{n} | {model_us:.0f} | {meas_us:.0f} | {meas_us / model_us:.2f} |")
    model_us = sum(r[3] for r in sums)
    meas_us = sum(r[4] for r in sums)
    out.append(f"| **measured launches** | {len(got)}/{len(costs)} | {model_us:.0f} | {meas_us:.0f} | "
               f"{(meas_us / model_us if model_us else float('nan')):.2f} |")
    missing = [c.label for c in costs if c.label not in got]
    if missing:
        out.append(f"\nNot measured ({len(missing)}): " + ", ".join(missing[:12])
                   + (" …" if len(missing) > 12 else ""))
    return "\n".join(out)


# ================================================================ entry points

def report(profile_name: str = "coppelius", target: str = "sm_90a", submission: str = "update",
           as_json: bool = False, measured: Path | None = None,
           stats: dict[str, KernelStats] | None = None) -> str:
    profile = profiles.get(profile_name)
    costs = model(profile, submission, stats if stats is not None else ptxas_stats(profile_name, target))
    lane = lanes(profile, submission, costs)
    floor = floors(costs, _lanes_of(profile, submission))
    if as_json:
        j = to_json(costs, profile_name, target, submission, lane, floor)
        if measured is not None:
            rows = read_measured(measured)
            compare(costs, rows)                     # refuses a table of another list
            got = {r["label"]: float(r["us"]) for r in rows}
            for e in j["per_launch"]:
                if e["label"] in got:
                    e["measured_us"] = got[e["label"]]
            j["measured"] = rows
        return json.dumps(j, indent=1)
    text = table(costs, profile_name, target, submission, lane, floor)
    if measured is not None:
        text += "\n\nModel vs measured (" + str(measured) + "):\n\n" + compare(costs, read_measured(measured))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="coppelius", choices=profiles.names())
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--submission", default="update", choices=("forward", "update", "final"))
    ap.add_argument("--json", action="store_true", help="the per-launch model as JSON")
    ap.add_argument("--measured", type=Path, help="a device check's per-launch JSON to compare with")
    a = ap.parse_args(argv)
    try:
        print(report(a.profile, a.target, a.submission, a.json, a.measured))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
