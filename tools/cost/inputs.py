"""The cost model's inputs (tools/cost/), each with its source: chip limits from the CUDA
C++ Programming Guide's compute capability 9.0 tables, figures measured on this workplace's H200
(/work/.library/device/KINDS.md), and stated assumptions — optimistic / central / pessimistic."""
from __future__ import annotations

from dataclasses import dataclass

SCENARIOS = ("optimistic", "central", "pessimistic")

# Chip limits: CUDA C++ Programming Guide, "Compute capability 9.0" feature/limit table, and the
# CUDA occupancy calculator's allocation rules for cc 9.0.
SMS = 132                         # KINDS.md: PyTorch reported 132 multiprocessors (2026-10-28)
CLOCK_HZ = 1.98e9                 # KINDS.md: nvidia-smi read SM 1980 MHz just after matmuls
REGS_PER_SM = 65536               # 32-bit registers per SM
SUBPARTITIONS = 4                 # a quarter of the register file each; a warp lives on one
REG_ALLOC_UNIT = 256              # registers allocated per warp in units of 256
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024          # shared memory per SM (the largest carveout)
SMEM_PER_BLOCK = 227 * 1024       # per block, with the opt-in attribute
SMEM_RESERVED = 1024              # per block, reserved by the system (cc ≥ 8.0)
SMEM_ALLOC_UNIT = 128
MUFU_PER_CLK = 16                 # exp2/log2/rcp/rsqrt results per clock per SM (guide's table)
ALU_PER_CLK = 128                 # fp32 add/mul/fma per clock per SM (guide's table)
LINE = 128                        # bytes per L2 line: one mapped-host-memory read request


@dataclass(frozen=True)
class Range:
    """An input with an optimistic, central and pessimistic value and where they come from."""
    optimistic: float
    central: float
    pessimistic: float
    source: str

    def __getitem__(self, scenario: str) -> float:
        for r, to in getattr(scenario, "moved", ()):
            if r is self:
                return getattr(self, to)
        return getattr(self, scenario)


class Scenario(str):
    """A scenario with some inputs moved to another scenario's value (the sensitivity analysis,
    tools/cost/sensitivity.py): it is its base scenario's name everywhere else (a key of every
    per-scenario table, the overlap rule of bounds.step_time), and each Range it indexes answers
    with the moved value where `moved` names it — ((Range, "optimistic" | "pessimistic"), ...)."""
    moved: tuple = ()

    def __new__(cls, base: str, moved=()):
        s = super().__new__(cls, base)
        s.moved = tuple(moved)
        return s


BF16_FLOPS = Range(
    798e12, 640e12, 480e12,
    "optimistic: KINDS.md, best 8192³ bf16 product on random data here (769–798 TFLOP/s, "
    "datasheet 989); central 0.8× and pessimistic 0.6× of it: assumption for Triton 3.9 wgmma "
    "kernels without TMA or warp specialization, at these small K (512–5504)")
MMA_SYNC_RATE = Range(
    0.67, 0.5, 0.4,
    "assumption (not measured here): the share of BF16_FLOPS a kernel reaches whose MMAs are "
    "the warp-level mma.sync (m16n8k16: Triton's choice below 64 rows a warpgroup, and all of "
    "the sm_80 build) rather than Hopper's warpgroup wgmma.  Hopper's full tensor rate is "
    "reached only through wgmma (HOPPER.md: a matrix kernel whose SASS shows only HMMA is on a "
    "slower path); published mma.sync kernels on H100 reach about half to two thirds of it")
WGMMA_SERIAL_CYCLES = Range(
    32, 64, 128,
    "assumption (not measured here): cycles each wgmma waits for the one before where ptxas "
    "serializes them (its warning C7515: non-wgmma instructions define an accumulator inside "
    "the pipeline stage), beyond the issue it would have overlapped: about the latency of an "
    "m64n64k16 (~100 cycles) less its ~35 cycles of tensor work, bracketed by a factor of two")
HBM_BW = Range(
    4.3e12, 3.8e12, 3.2e12,
    "optimistic: KINDS.md device copy ≈4.3 TB/s read+write (datasheet 4.8); central 0.88×, "
    "pessimistic 0.75×: assumption for 1–100 MB launches (ramp and tail)")
L2_BW = Range(
    10e12, 7.5e12, 5.5e12,
    "assumption (not measured here; NVIDIA publishes no H100/H200 figure): optimistic is A100's "
    "whitepaper 5,120 B/clk at 1.98 GHz; pessimistic allows for traffic across the two L2 halves "
    "and a clock that falls under L2 load (Chips and Cheese, 'Nvidia's H100: Funny L2, and Tons "
    "of Bandwidth', 2023-07-02: the L2 split in two partitions, an H100 PCIe's clock down to "
    "1,395 of 1,755 MHz, power-limited, when pulling data from L2).  The update's L2 floor moves "
    "with it alone (the report's sensitivity table)")
SM_L2_BW = Range(
    64 * CLOCK_HZ, 48 * CLOCK_HZ, 32 * CLOCK_HZ,
    "assumption: one SM's L1↔L2 path, 64 B/clk (optimistic), 48, 32 (far L2 half) at 1.98 GHz")
L2_LATENCY = Range(0.15e-6, 0.25e-6, 0.4e-6,
                   "assumption: a dependent load that hits L2 (≈300–800 cycles, near/far half)")
HBM_LATENCY = Range(0.35e-6, 0.6e-6, 0.9e-6,
                    "one dependent round trip to device memory (a load that misses L2, issued "
                    "after the store or barrier it waits for: the PTX pass's levels, "
                    "ptx_chain.py).  Optimistic: an unloaded pointer chase on Hopper, ~690 cycles "
                    "≈ 0.35 µs (published Hopper microbenchmarks' figure; not "
                    "measured here); central 0.6 µs assumes ~1.7× that while the chip streams "
                    "(the performance brief's figure for a loaded chip); pessimistic 0.9 µs "
                    "queues behind the other lane's streams.  Charged for every round trip of a "
                    "tile's chain, fresh (L2-resident) data included")
PHASE = Range(0.02e-6, 0.04e-6, 0.08e-6,
              "assumption: one dependent wait inside a trip — wgmma issue→wait, or a cross-warp "
              "reduction through shared memory with a barrier (≈40–160 cycles)")
DEP_OP_CYCLES = Range(4, 8, 12, "assumption: latency of one dependent fp32/fp64 op on the chain")
LAUNCH = Range(1.3e-6, 2.5e-6, 3.5e-6,
               "per launch inside a CUDA graph on a full edge (the gap, ramp and tail between "
               "dependent kernels).  Optimistic: ~1.3 µs a kernel, published H100 measurements "
               "under CUDA graphs (a published figure; not measured here); central 2.5 µs and "
               "pessimistic 3.5 µs: the performance brief's assumption (HELPER_GUIDE).  In the "
               "graph only the full edges pay it (the programmatic ones pay LAUNCH_PDL; the "
               "report counts both); the device check's graph with every edge full measures it")
LAUNCH_PDL = Range(
    0.7e-6, 1.2e-6, 2.5e-6,
    "assumption, for an edge captured programmatically (plan/launches/graph.programmatic): the next "
    "grid is launched and its blocks dispatched while this one works (CUDA Programming Guide, "
    "programmatic dependent launch), so the edge keeps this grid's completion and memory flush, "
    "the wait's release and the next grid's first loads; pessimistic: only the launch processing "
    "is hidden (blocks that cannot be resident beside this grid dispatch as its blocks retire). "
    "Calibrated by tools/gpu_check/launches.py, which times the graph with and without them")
L2_RESIDENT = Range(
    0.9, 0.75, 0.5,
    "assumption: the fraction of the bytes a launch's predecessor just wrote that are still in "
    "L2 when it reads them, while those bytes fit in L2 (L2_BYTES): optimistic most of them, "
    "pessimistic half (the other lane's traffic and the hash across the two L2 halves evict "
    "some); what is not resident is charged to HBM as before")
PCIE_BW = Range(50e9, 35e9, 20e9,
                "assumption: GPU reads of mapped host memory over PCIe Gen5 x16 (64 GB/s raw per "
                "direction); less with 128-byte requests and an IOMMU (Firecracker VM)")
PCIE_LATENCY = Range(1.0e-6, 1.5e-6, 3.0e-6,
                     "assumption: one GPU read of host memory, request to completion")
PCIE_IN_FLIGHT = Range(768, 512, 256,
                       "assumption: host-memory read requests the GPU keeps in flight (PCIe 10-bit "
                       "tags allow 768; 50 GB/s at 1.5 µs needs ≈600 of 128 B)")
STAGING_CACHED = Range(1, 0, 0,
                       "assumption: optimistic — the GPU caches mapped host memory in L2, so each "
                       "line crosses PCIe once per launch; central/pessimistic — every read does "
                       "(CUDA Best Practices: read mapped memory once)")
# The correctly rounded fp32 operations as ptxas 13.0 expands them for sm_90a, (MUFU, other issue
# slots) on the fast path: counted on this machine (2026-12-01) in nvdisasm's listing of
# weight_grad_0bcdb623cf (coppelius, the old epilogue): sqrt.rn.f32 → MUFU.RSQ +
# IADD3, ISETP, BSSY, BRA, 2 FMUL, 2 FFMA, BSYNC; div.rn.f32 → MUFU.RCP + BSSY, FCHK, 5 FFMA,
# BRA, BSYNC.  Each ends in a branch to a slow-path CALL taken only for operands out of range
# (denormal, huge): never on AdamW's data.
# With these the PTX count of that kernel's epilogue is 3,460 issue slots per thread per tile;
# the listing's fast path holds 3,328 (4% fewer: the masked loads' zero moves pair up).
DIV_RN_F32 = (1, 9)
SQRT_RN_F32 = (1, 9)

STREAM_PRIORITY = (
    "assumption, from the CUDA driver API's cuStreamCreateWithPriority (CUDA 12/13): priorities "
    "'provide a hint to preferentially run work with higher priority when possible, but do not "
    "preempt already-running work'; so the model's block scheduler places the pending CTAs of "
    "the higher-priority stream's grids first whenever SMs free up, and never evicts a resident "
    "CTA (nor one resident at its programmatic wait).  In a graph the kernel nodes carry their "
    "capture stream's priority only when it is instantiated with "
    "CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (cuGraphInstantiateWithFlags: otherwise "
    "every node runs at the priority of the stream the graph is launched into)")

PLACEMENT = (
    "assumption, from Gilman, Ogden, Guo and Walls, 'Demystifying the Placement Policies of the "
    "NVIDIA GPU Thread Block Scheduler for Concurrent Kernels' (SIGMETRICS PER, 2020; Pascal, "
    "Volta, Turing, not Hopper): the scheduler picks the next SM by its free resources, not "
    "round-robin; the model's block scheduler (sm_sim.py) places each CTA on the SM that takes "
    "the most of its grid's CTAs, so a grid on an idle chip spreads one CTA per SM before any SM "
    "gets two (a 130-CTA weight gradient alone holds 130 SMs, not 65), and the SMs freed at one "
    "instant take the next CTAs together.  The report's what-if packs every grid instead "
    "(ceil(CTAs / CTAs per SM) SMs: sensitivity.py `packed_us`)")
SHARING = (
    "assumption: the CTAs working on one SM share its tensor cores, its other pipes and its "
    "L1↔L2 path (one SM's wgmma, MUFU/ALU issue and L1 bandwidth are the SM's, whichever CTA "
    "issues).  Each phase of a CTA asks the SM its throughput time over its time alone "
    "(bounds.step_parts); while the working CTAs' asks add up to at most one each runs at full "
    "rate (one's dependent waits are the others' issue slots), past one all slow by the sum.  "
    "Not measured: the device check's per-launch and graph timings test it (the claim: two "
    "identical CTAs at 2 per SM take ~2× one CTA's K loop; none hides the other's epilogue)")

L2_BYTES = 60e6                   # KINDS.md: PyTorch reported 60 MB of L2 on this H200

EMBED_CHAIN = 9   # longest dE chain: the most frequent id's count in a context.  Measured on this
#                   machine: coppelius.staging.synthetic.generate(coppelius), first 200 contexts: median 9,
#                   range 5–15 (the marker M0 of the Markov blocks, in embed_grad's program 0)

EMBED_DISTINCT = 323  # distinct ids in a context: E's rows embed_grad updates (the rest are
#                       embed_decay's).  Measured on this machine: coppelius.staging.synthetic.generate(coppelius),
#                       first 200 contexts, np.unique: median 323, range 113–560 (2026-12-01)

INPUTS = {name: value for name, value in globals().items() if isinstance(value, Range)}
