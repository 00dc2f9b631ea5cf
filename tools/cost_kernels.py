"""What each kernel family does per program, for the cost model (tools/cost_model.py): a registry
keyed by the Triton function name.  An entry reads a Launch (grid, arguments, constexprs) and
returns its Work: the programs in blockIdx order with their loop trips, one trip's and the
prologue/epilogue's work (MMA FLOPs, bytes loaded and stored, MUFU and ALU operations, dependent
waits and memory round trips), the launch's unique HBM bytes, and its staging traffic per
argument.  Counting rules: a trip's bytes are what one program loads and stores in it (L2 traffic);
a tile loaded by many programs counts once per program; masked-out lanes move nothing.

To cost a new kernel: write `@family("name") def _name(v: View) -> Work` here; the model refuses a
launch whose function has no entry, whose programs disagree with its grid, or whose staging
arguments the entry does not account for.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from cost_inputs import EMBED_CHAIN, EMBED_DISTINCT, LINE  # noqa: E402
from plan import launches  # noqa: E402
from plan.attention_split import AttentionSplit  # noqa: E402
from plan.buffers import DTYPE_BYTES  # noqa: E402
from staging import layout as SL  # noqa: E402


@dataclass(frozen=True)
class Step:
    """The work of one loop trip of one program (or of its prologue + epilogue)."""
    mma_flops: float = 0.0
    load_bytes: float = 0.0        # global loads (L2, and HBM on a miss)
    store_bytes: float = 0.0
    mufu_ops: float = 0.0          # exp, log, rcp, sqrt (div_rn is one rcp + ~10 ALU ops)
    alu_ops: float = 0.0           # other elementwise ops, over the whole program
    phases: int = 0                # dependent waits (PHASE each)
    serial_ops: int = 0            # dependent arithmetic on the chain (DEP_OP_CYCLES each)
    l2_trips: int = 0              # dependent loads that hit L2 (L2_LATENCY each)
    hbm_trips: int = 0             # dependent loads that miss (HBM_LATENCY each)
    staging_trips: int = 0         # dependent reads of mapped host memory (PCIE_LATENCY each)


NOTHING = Step()


@dataclass(frozen=True)
class Programs:
    """Consecutive programs (blockIdx order) that share a trip and a prologue/epilogue."""
    trips: tuple[int, ...]         # loop trips of each program
    step: Step
    fixed: Step = NOTHING


@dataclass(frozen=True)
class Staging:
    """One staging (mapped host memory) argument's traffic in a launch, over all programs."""
    arg: str
    read_bytes: float = 0.0
    read_requests: int = 0         # LINE-sized (or smaller) read requests
    unique_bytes: float = 0.0      # distinct bytes read (what crosses PCIe if it is cached)
    write_bytes: float = 0.0


@dataclass(frozen=True)
class Work:
    programs: tuple[Programs, ...]
    hbm_bytes: float               # unique bytes read + written in device memory
    staging: tuple[Staging, ...] = ()
    extra_l2_bytes: float = 0.0    # traffic of a few programs kept out of their chain (h16 stores)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def lines(nbytes: float) -> int:
    return cdiv(int(nbytes), LINE)


class View:
    """A Launch's arguments by name: scalars, constexprs, element sizes, staging arguments."""

    def __init__(self, launch, bufs):
        self.launch, self.bufs = launch, bufs
        self.args = dict(launch.args)
        self.c = dict(launch.constexprs)

    def scalar(self, name: str) -> int:
        return int(self.args[name].value)

    def elem(self, name: str) -> int:
        return DTYPE_BYTES[self.args[name].dtype]

    @property
    def programs(self) -> int:
        return self.launch.grid[0] * self.launch.grid[1] * self.launch.grid[2]

    def staging_args(self) -> set[str]:
        return {n for n, a in self.launch.args if hasattr(a, "field") and not hasattr(a, "buffer")}


def uniform(count: int, trips: int, step: Step, fixed: Step = NOTHING) -> Programs:
    return Programs((trips,) * count, step, fixed)


# ---------------------------------------------------------------- the registry
REGISTRY: dict[str, Callable[[View], Work]] = {}


def family(*functions: str):
    def register(fn):
        for f in functions:
            REGISTRY[f] = fn
        return fn
    return register


# -- matmuls: one program per (BLOCK_M, BLOCK_N) tile, a K loop of BLOCK_K trips (software
#    pipelined when num_stages > 1: the next chunks are in flight, so a trip waits on no load;
#    with one stage — the tiny profile — each trip waits for its chunks from L2)

def _mm_step(v: View, BM, BN, BK, a_bytes, b_bytes, products=1, alu=0.0) -> Step:
    return Step(mma_flops=products * 2 * BM * BN * BK,
                load_bytes=BM * BK * a_bytes + products * BK * BN * b_bytes, alu_ops=alu, phases=1,
                l2_trips=0 if v.launch.num_stages > 1 else 1)


def _tiles(v: View, M, N, BM, BN) -> int:
    tiles = cdiv(M, BM) * cdiv(N, BN)
    if tiles != v.programs:
        raise ValueError(f"{v.launch.label}: {tiles} tiles of {BM}×{BN} but grid {v.launch.grid}")
    return tiles


@family("matmul")
def _matmul(v: View) -> Work:
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK, epi = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"], v.c["EPILOGUE"]
    S = v.c.get("SPLIT_K", 1)
    a, b = v.elem("a_ptr"), v.elem("b_ptr")
    tiles = cdiv(M, BM) * cdiv(N, BN)
    if tiles * S != v.programs:
        raise ValueError(f"{v.launch.label}: {tiles} tiles of {BM}×{BN} × {S} K splits but grid "
                         f"{v.launch.grid}")
    e = BM * BN
    # epilogue per tile: (aux loaded, c stored, MUFU, ALU) — meta.EPI_* codes
    aux, out, mufu, alu = {0: (0, 4 * e, 0, e), 1: (0, 2 * e, 0, 2 * e), 2: (4 * e, 4 * e, 0, 2 * e),
                           # SwiGLU backward: [a|b] fp32 in, [da|db] bf16 out; exp + 2 div_rn
                           3: (8 * e, 4 * e, 3 * e, 30 * e)}[epi]
    fixed = Step(load_bytes=aux, store_bytes=out, mufu_ops=mufu, alu_ops=alu, hbm_trips=1)
    c_unique = S * M * N * (4 if epi in (0, 2) else 2) * (2 if epi == 3 else 1)
    aux_unique = {0: 0, 1: 0, 2: M * N * 4, 3: 2 * M * N * 4}[epi]
    # split s of S sums chunks [s·per, (s+1)·per) of the cdiv(K, BK) chunks (the last may be short)
    chunks = cdiv(K, BK)
    per = cdiv(chunks, S)
    trips = tuple(max(0, min(per, chunks - s * per)) for s in range(S) for _ in range(tiles))
    return Work((Programs(trips, _mm_step(v, BM, BN, BK, a, b), fixed),),
                hbm_bytes=M * K * a + K * N * b + c_unique + aux_unique)


def _norm_prologue(v: View, products: int, epilogue: Step, out_unique: float) -> Work:
    """matmul_rotary: each program forms its rows' r from the producer's
    SSQ_PARTS partial sums of squares (a dependent load of BM × parts words before the K loop),
    then loads the fp32 rows, scales and rounds them as the A operand (fp32 A read once per
    column tile); programs of column tile 0 store h16 and rstd."""
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    parts = v.c["SSQ_PARTS"]
    x, w = v.elem("x_ptr"), v.elem("w_ptr" if "w_ptr" in v.args else "wg_ptr")
    tiles = _tiles(v, M, N, BM, BN)
    step = _mm_step(v, BM, BN, BK, x, w, products, alu=2 * BM * BK)      # x·r, round
    fixed = Step(load_bytes=epilogue.load_bytes + parts * BM * 4, store_bytes=epilogue.store_bytes,
                 mufu_ops=epilogue.mufu_ops + BM, alu_ops=epilogue.alu_ops + (20 + parts) * BM,
                 phases=1, hbm_trips=1, l2_trips=1)                # + rstd of BM rows from ssq
    h16_rstd = M * K * 2 + M * 4
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * x + products * N * K * w + h16_rstd
                + parts * M * 4 + out_unique, extra_l2_bytes=h16_rstd)


@family("matmul_residual")
def _matmul_residual(v: View) -> Work:
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    tiles = _tiles(v, M, N, BM, BN)
    e = BM * BN
    # epilogue: the residual tile in, x + acc out, and its per-row Σ x² (a row reduction) out
    fixed = Step(load_bytes=4 * e, store_bytes=4 * e + 4 * BM, alu_ops=4 * e, phases=1, hbm_trips=1)
    return Work((uniform(tiles, cdiv(K, BK), _mm_step(v, BM, BN, BK, v.elem("a_ptr"),
                                                      v.elem("b_ptr")), fixed),),
                hbm_bytes=M * K * 2 + K * N * 2 + 2 * M * N * 4 + cdiv(N, BN) * M * 4)


@family("matmul_rotary")
def _matmul_rotary(v: View) -> Work:
    M, N, d = v.scalar("M"), v.scalar("N"), v.c["HEAD_DIM"]
    BM, BN = v.c["BLOCK_M"], v.c["BLOCK_N"]
    # rope [cos|sin] rows in, rotation (~6 ops per element), bf16 q'|k'|v out
    epi = Step(load_bytes=BM * d * 4, store_bytes=BM * BN * 2, alu_ops=6 * BM * BN)
    return _norm_prologue(v, 1, epi, out_unique=M * N * 2 + M * d * 4)


@family("matmul_swiglu")
def _matmul_swiglu(v: View) -> Work:
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    # two products of the bf16 h16 rmsnorm_rows wrote; ab = [a|b] fp32 and z = bf(silu(a)·b)
    # out: exp + div_rn per element
    tiles = _tiles(v, M, N, BM, BN)
    step = _mm_step(v, BM, BN, BK, v.elem("h16_ptr"), v.elem("wg_ptr"), 2)
    e = BM * BN
    fixed = Step(store_bytes=e * (8 + 2), mufu_ops=2 * e, alu_ops=15 * e, phases=1, hbm_trips=1)
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * 2 + 2 * N * K * v.elem("wg_ptr") + M * N * (8 + 2))


@family("matmul_delta")
def _matmul_delta(v: View) -> Work:
    M, N, K, d = v.scalar("M"), v.scalar("N"), v.scalar("K"), v.c["HEAD_DIM"]
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    tiles = _tiles(v, M, N, BM, BN)
    # fp32 dO out, fp32 o in, delta = Σ_d dO·o per head (a reduction over d)
    fixed = Step(load_bytes=BM * BN * 4, store_bytes=BM * BN * 4 + BM * (BN // d) * 4,
                 alu_ops=3 * BM * BN, phases=1, hbm_trips=1)
    step = _mm_step(v, BM, BN, BK, v.elem("a_ptr"), v.elem("b_ptr"))
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * 2 + K * N * 2 + 2 * M * N * 4 + M * N // d * 4)


# -- weight gradients with AdamW in the epilogue (the side lane)

_PMV_BYTES = 3 * 4                # P, M, V fp32 of one parameter element
_ADAMW_ALU, _ADAMW_MUFU = 40, 3   # per element: ~20 fp32 ops + two div_rn (≈10 ALU + rcp each)
#                                   and a sqrt_rn (as the adamw entry)
_BIAS_CORRECTION_OPS = 120        # t → two float64 powers by 40 squarings, a division, a sqrt


def _doorbell(v: View, readers: int) -> tuple[Step, tuple]:
    """The doorbell read at the start of `readers` programs: a dependent read on each chain (of
    staging, or of the device copy in L2), then the bias corrections."""
    if "doorbell_ptr" in v.staging_args():
        return (Step(serial_ops=_BIAS_CORRECTION_OPS, staging_trips=1),
                (Staging("doorbell_ptr", read_bytes=4 * readers, read_requests=readers,
                         unique_bytes=4),))
    return Step(serial_ops=_BIAS_CORRECTION_OPS, l2_trips=1), ()


def _plus(a: Step, b: Step) -> Step:
    return Step(*(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))))


def _times(a: Step, k: int) -> Step:
    return Step(*(x * k for x in dataclasses.astuple(a)))


@family("weight_grad")
def _weight_grad(v: View) -> Work:
    """Tiles of product 0 then product 1 in one numbering; program pid runs tiles pid,
    pid + programs, … (the side lane's grid is at most `dw_programs`): a program of k tiles makes
    k K loops and k AdamW epilogues after one doorbell read and one set of bias corrections."""
    T, c = v.scalar("T"), v.c
    BM, BN, BK = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
    dims = [(v.scalar("M0"), v.scalar("N0")), (v.scalar("M1"), v.scalar("N1"))][:c["PRODUCTS"]]
    e = BM * BN
    tiles = sum(cdiv(M, BM) * cdiv(N, BN) for M, N in dims)
    P = v.programs
    if not 1 <= P <= tiles:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid} for {tiles} tiles")
    start, staged = _doorbell(v, P)
    # K = T loop of bf16 dy and x chunks; the epilogue reads P, M, V of the tile and writes them
    # and w16 (the gradient never leaves registers)
    step = _mm_step(v, BM, BN, BK, v.elem("a0_ptr"), v.elem("b0_ptr"))
    epilogue = Step(load_bytes=_PMV_BYTES * e, store_bytes=(_PMV_BYTES + 2) * e,
                    mufu_ops=_ADAMW_MUFU * e, alu_ops=_ADAMW_ALU * e, phases=1, hbm_trips=1)
    more, base = tiles % P, tiles // P                  # the first `more` programs run base + 1
    groups = [uniform(n, k * cdiv(T, BK), step, _plus(start, _times(epilogue, k)))
              for n, k in ((more, base + 1), (P - more, base)) if n]
    hbm = sum(T * M * 2 + T * N * 2 + M * N * (2 * _PMV_BYTES + 2) for M, N in dims)
    return Work(tuple(groups), hbm_bytes=hbm, staging=staged)


# -- attention (plan/attention_split.py): one warpgroup per program, trips over 64-row blocks;
#    each trip's dots depend on the previous elementwise work (FA2 order), K/V (Q/dO) of the next
#    trip prefetched.  The chunk programs decode their id in a scalar loop over the blocks before
#    them (DECODE_OPS dependent integer ops per block skipped, on the chain before the first load)

DECODE_OPS = 5          # per block skipped: subtract, decrement, multiply-add, shift, compare


def _attn_dims(v: View):
    T = v.scalar("T")
    H, d = v.c["HEADS"], v.c["HEAD_DIM"]
    G = v.c.get("KV_HEADS", H)
    return T, H, G, d, v.c["BLOCK_M"], v.c["BLOCK_N"], (H + 2 * G) * d


def _split(v: View) -> AttentionSplit:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    return AttentionSplit(T, BM, BN, H, G, v.c.get("FWD_CHUNK", 1), v.c.get("BWD_CHUNK", 1))


def _check_programs(v: View, n: int, what: str):
    if v.programs != n:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid}, the split has {n} {what}")


def _by_fixed(progs, trips_of, fixed_of, step) -> tuple[Programs, ...]:
    """Consecutive programs sharing a prologue/epilogue (here: the same decode length) grouped."""
    out, run, key = [], [], None
    for prog in progs:
        k = fixed_of(prog)
        if run and k != key:
            out.append(Programs(tuple(run), step, key))
            run = []
        run.append(trips_of(prog))
        key = k
    out.append(Programs(tuple(run), step, key))
    return tuple(out)


@family("attention_fwd")
def _attention_fwd(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp = _split(v)
    progs = sp.fwd_programs()
    _check_programs(v, len(progs), "forward chunk programs")
    e = BM * BN
    step = Step(mma_flops=2 * (2 * BM * BN * d), load_bytes=2 * BN * d * 2,      # K, V tiles
                mufu_ops=e + BM, alu_ops=8 * e, phases=4)       # s, row max, row sum, p·v
    part = BM * d * 4 + 2 * BM * 4                                # acc, m, l of one chunk, fp32

    def fixed(prog):                                             # q in; the partial out
        m = prog[0]
        return Step(load_bytes=BM * d * 2, store_bytes=part, hbm_trips=1,
                    serial_ops=DECODE_OPS * (sp.q_blocks - 1 - m))
    return Work(_by_fixed(progs, lambda pr: sp.fwd_chunk_trips(pr[0], pr[1]), fixed, step),
                hbm_bytes=T * W * 2 + len(progs) * part)


@family("attention_fwd_merge")
def _attention_fwd_merge(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp = _split(v)
    progs = sp.fwd_merge_programs()
    _check_programs(v, len(progs), "(query block, head) merges")
    part = BM * d * 4 + 2 * BM * 4
    # per chunk: acc_c, l_c and m_c (twice: the max pass) in, one exp, a multiply-add per element;
    # one stage: each trip waits for its loads
    step = Step(load_bytes=part + BM * 4, mufu_ops=BM, alu_ops=2 * BM * d + 4 * BM, l2_trips=1)
    fixed = Step(store_bytes=BM * d * (2 + 4) + BM * 4, mufu_ops=BM * d + BM,   # o16, o32, lse
                 alu_ops=12 * BM * d, hbm_trips=1)
    partials = sum(sp.fwd_chunks(m) for m, _ in progs)
    return Work((Programs(tuple(sp.fwd_chunks(m) for m, _ in progs), step, fixed),),
                hbm_bytes=partials * part + T * H * d * (2 + 4) + H * T * 4)


@family("attention_bwd")
def _attention_bwd(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp = _split(v)
    progs = sp.dkdv_programs()
    _check_programs(v, len(progs), "dK/dV chunk programs")
    e = BM * BN
    # a (query head, query block) trip: kqᵀ, pᵀdO, v dOᵀ, dsᵀq; qᵀ, dO (fp32), lse, delta in;
    # the bf(ds)ᵀ tile out
    step = Step(mma_flops=4 * (2 * BN * BM * d), load_bytes=d * BM * 2 + BM * d * 4 + 2 * BM * 4,
                store_bytes=e * 2, mufu_ops=e, alu_ops=10 * e + BM * d, phases=5)
    part = 2 * BN * d * 4                                         # dk', dv partial, fp32

    def fixed(prog):                                             # k, v in; the partial out
        n = prog[0]
        return Step(load_bytes=2 * BN * d * 2, store_bytes=part, hbm_trips=1,
                    serial_ops=DECODE_OPS * n)
    ds_tiles = H * sum(sp.q_blocks - sp.first_q(n) for n in range(sp.kv_blocks))
    return Work(_by_fixed(progs, lambda pr: len(sp.dkdv_chunk_pairs(pr[0], pr[1])), fixed, step),
                hbm_bytes=T * W * 2 + T * H * d * 4 + 2 * H * T * 4 + ds_tiles * e * 2
                + len(progs) * part)


@family("attention_bwd_dq")
def _attention_bwd_dq(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp = _split(v)
    progs = sp.dq_programs()
    _check_programs(v, len(progs), "dQ + merge programs")
    rope = BM * d * 4                                             # [cos|sin] rows, fp32
    # dQ (query block m, head): kv blocks 0 .. m, one product per trip from the stored bf(ds)ᵀ
    dq_trips = tuple(sp.fwd_kv_blocks(m) for kind, m, _ in progs if kind == "dq")
    dq_step = Step(mma_flops=2 * BM * BN * d, load_bytes=BN * BM * 2 + BN * d * 2, phases=1)
    dq_fixed = Step(load_bytes=rope, store_bytes=BM * d * 2, alu_ops=6 * BM * d, hbm_trips=1)
    # merge (kv block n, kv head): its chunks' partials in slot order; loads that feed no dot
    # are not software-pipelined: each trip waits for its partial from L2
    part = 2 * BN * d * 4
    mg_trips = tuple(sp.dkdv_chunks(n) for kind, n, _ in progs if kind == "merge")
    mg_step = Step(load_bytes=part, alu_ops=2 * BN * d, l2_trips=1)
    mg_fixed = Step(load_bytes=BN * d * 4, store_bytes=2 * BN * d * 2, alu_ops=8 * BN * d,
                    hbm_trips=1)
    ds_tiles = H * sum(sp.q_blocks - sp.first_q(n) for n in range(sp.kv_blocks))
    return Work((Programs(dq_trips, dq_step, dq_fixed), Programs(mg_trips, mg_step, mg_fixed)),
                hbm_bytes=ds_tiles * BM * BN * 2 + T * G * d * 2 + sum(mg_trips) * part
                + T * d * 4 + T * W * 2)


# -- row kernels: BLOCK_R whole rows per program, one pass (num_stages = 1)

@family("rmsnorm_bwd")
def _rmsnorm_bwd(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    gain, acc, bf16 = v.c["HAS_GAIN"], v.c["ACCUMULATE"], v.c["WRITE_BF16"]
    parts = v.c.get("DY_PARTS", 1)
    return Work((uniform(v.programs, 1, _norm_rows(D, R, gain, acc, bf16, parts)),),
                hbm_bytes=_norm_rows_unique(T, D, gain, acc, bf16, parts))


def _norm_rows(D, R, gain, acc, bf16, parts=1) -> Step:
    """dy (its `parts` split-K partials), x, r (and g, and the dx accumulated into) in; dx (and
    bf(dx)) out; a row reduction."""
    rows = R * D * 4
    return Step(load_bytes=(parts + 1) * rows + R * 4 + (D * 4 if gain else 0)
                + (rows if acc else 0),
                store_bytes=rows + (R * D * 2 if bf16 else 0), alu_ops=(7 + parts) * R * D,
                mufu_ops=R, phases=1, hbm_trips=1)


def _norm_rows_unique(T, D, gain, acc, bf16, parts=1) -> float:
    return T * D * 4 * (2 + parts + (1 if acc else 0)) + T * 4 + (D * 4 if gain else 0) \
        + (T * D * 2 if bf16 else 0)


def _gain_programs(T, D, GR, GC, parts) -> Programs:
    """cdiv(D, GC) gain-column programs: T/GR trips of (r, x, dy partials) chunks, each a column
    sum, no prefetch (one-stage loop): a dependent L2 load per trip."""
    gain = Step(load_bytes=GR * 4 + (1 + parts) * GR * GC * 4, alu_ops=(2 + parts) * GR * GC,
                phases=1, l2_trips=1)
    return uniform(cdiv(D, GC), cdiv(T, GR), gain, Step(store_bytes=GC * 4, hbm_trips=1))


@family("final_norm")
def _final_norm(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    # BLOCK_R fp32 rows and the gain in, a row reduction, bf16 rows and rstd out
    step = Step(load_bytes=R * D * 4 + D * 4, store_bytes=R * D * 2 + R * 4, alu_ops=6 * R * D,
                mufu_ops=R, phases=1, hbm_trips=1)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=T * D * (4 + 2) + D * 4 + T * 4)


@family("rmsnorm_rows")
def _rmsnorm_rows(v: View) -> Work:
    T, D, R, parts = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["SSQ_PARTS"]
    # the rows' partial sums of squares, then BLOCK_R fp32 rows in (a dependent load after r),
    # bf16 rows and rstd out
    step = Step(load_bytes=R * parts * 4 + R * D * 4, store_bytes=R * D * 2 + R * 4,
                alu_ops=(2 + parts) * R + 2 * R * D, mufu_ops=3 * R, phases=1,
                l2_trips=1, hbm_trips=1)
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=T * D * (4 + 2) + T * 4 + parts * T * 4)


@family("rmsnorm_bwd_gain")
def _rmsnorm_bwd_gain(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    GR, GC, bf16 = v.c["GAIN_ROWS"], v.c["GAIN_COLS"], v.c["WRITE_BF16"]
    parts = v.c.get("DY_PARTS", 1)
    rows, cols = cdiv(T, R), cdiv(D, GC)
    if v.programs != rows + cols:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid}, expected {rows} + {cols}")
    return Work((uniform(rows, 1, _norm_rows(D, R, True, False, bf16, parts)),
                 _gain_programs(T, D, GR, GC, parts)),
                hbm_bytes=_norm_rows_unique(T, D, True, False, bf16, parts) + D * 4)


@family("cross_entropy")
def _cross_entropy(v: View) -> Work:
    T, V, R = v.scalar("T"), v.c["V"], v.c["ROWS"]
    e = R * V
    # one fp32 logits row in, bf16 dlogits out; exp and the softmax's div_rn per element, and a
    # second div_rn by T unless T is a power of two (INV_T: a multiplication); max/sum/pick
    # reductions; the rows' targets (staging, or the staged device copy: an L2 hit) on the chain
    staged = "targets_ptr" in v.staging_args()
    divisions = 1 if v.c.get("INV_T") else 2
    step = Step(load_bytes=e * 4 + (0 if staged else R * 4), store_bytes=e * 2,
                mufu_ops=(1 + divisions) * e, alu_ops=(10 + 10 * divisions) * e, phases=3,
                hbm_trips=1, staging_trips=1 if staged else 0,
                l2_trips=0 if staged else 1)
    targets = ((Staging("targets_ptr", read_bytes=T * 4, read_requests=v.programs,
                        unique_bytes=T * 4),) if staged else ())
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=T * V * (4 + 2) + (0 if staged else T * 4),
                staging=targets + (Staging("loss_ptr", write_bytes=T * 4),
                                   Staging("w0_ptr", write_bytes=T * 4)))


@family("embed_fwd")
def _embed_fwd(v: View) -> Work:
    T, D, R, d = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["HEAD_DIM"]
    P = v.programs
    # own ids (twice: gather and links) and all T ids (links) — from staging, or from the staged
    # device copy (L2) — then the rows gathered (dependent), rmsnorm, the rope rows in float64
    # (sin/cos ≈ 40 dependent ops)
    per = 2 * R * 4 + T * 4
    staged = "ids_ptr" in v.staging_args()
    parts = v.c["SSQ_PARTS"]
    step = Step(load_bytes=R * D * 4 + D * 4 + (0 if staged else per),
                store_bytes=2 * R * D * 4 + R * 4 + R * d * 4 + R * 4 + R * parts * 4,
                mufu_ops=R, alu_ops=8 * R * D + 3 * R * T + 80 * R * d, phases=3, serial_ops=80,
                hbm_trips=1, staging_trips=1 if staged else 0, l2_trips=0 if staged else 1)
    ids = ((Staging("ids_ptr", read_bytes=P * per,
                    read_requests=P * (2 * lines(R * 4) + lines(T * 4)), unique_bytes=T * 4),)
           if staged else ())
    return Work((uniform(P, 1, step),),
                hbm_bytes=T * D * 4 * 3 + D * 4 + T * 4 + T * d * 4 + T * 4 + T * parts * 4,
                staging=ids)


def _present(T: int, V: int) -> float:
    """The fraction of E's rows a context's ids hold (EMBED_DISTINCT, at most T and V)."""
    return min(EMBED_DISTINCT, T, V) / V


@family("embed_decay")
def _embed_decay(v: View) -> Work:
    T, V, D, BV = v.scalar("T"), v.scalar("V"), v.c["D"], v.c["BLOCK_V"]
    P, blocks = v.programs, cdiv(V, BV)
    # per vocabulary block a program reads the T ids (from L2), compares them with its BLOCK_V
    # ids, then updates the absent rows (g = 0: P, M, V in and out), spread evenly over the blocks
    absent = 1.0 - _present(T, V)
    fixed, staged = _doorbell(v, P)
    e = BV * D * absent
    trip = Step(load_bytes=T * 4 + _PMV_BYTES * e, store_bytes=_PMV_BYTES * e,
                mufu_ops=_ADAMW_MUFU * e, alu_ops=3 * BV * T + _ADAMW_ALU * e, phases=1,
                l2_trips=1, hbm_trips=1)
    more, base = blocks % P, blocks // P              # the first `more` programs run base + 1
    groups = tuple(uniform(n, k, trip, fixed) for n, k in ((more, base + 1), (P - more, base)) if n)
    w1 = v.c["W1_WORDS"] * 4 * absent
    return Work(groups, hbm_bytes=T * 4 + V * D * absent * 2 * _PMV_BYTES,
                staging=staged + (Staging("w1_ptr", write_bytes=w1),))


@family("embed_grad")
def _embed_grad(v: View) -> Work:
    T, V, D, BV = v.scalar("T"), v.scalar("V"), v.c["D"], v.c["BLOCK_V"]
    P = v.programs - 1                                # the last program updates the two gains
    # every program reads all T ids and compares them with its BLOCK_V ids, then walks the
    # chains: one dependent trip per occurrence of its most frequent id (program 0 holds the
    # markers: EMBED_CHAIN trips; the others one) — a de row and a next-row link per trip; then
    # AdamW on its present rows of E (P, M, V in and out; embed_decay has the absent ones),
    # spread evenly over the blocks
    ids_staged = "ids_ptr" in v.staging_args()
    start, staged = _doorbell(v, v.programs)
    trip = Step(load_bytes=D * 4 + 4, alu_ops=4 * BV * D, phases=1, l2_trips=1)
    present = _present(T, V)
    e = BV * D * present
    fixed = _plus(start, Step(load_bytes=(0 if ids_staged else T * 4) + _PMV_BYTES * e,
                              store_bytes=_PMV_BYTES * e, mufu_ops=_ADAMW_MUFU * e,
                              alu_ops=3 * BV * T + _ADAMW_ALU * e, phases=1,
                              staging_trips=1 if ids_staged else 0,
                              l2_trips=0 if ids_staged else 1, hbm_trips=1))
    trips = (EMBED_CHAIN,) + (1,) * (P - 1)
    missing_rows = max(0, T - sum(trips))             # de rows read in trips not modelled
    g = 2 * D                                         # both gains
    gains = uniform(1, 1, _plus(start, Step(load_bytes=g * 4 + _PMV_BYTES * g,
                                            store_bytes=_PMV_BYTES * g, mufu_ops=_ADAMW_MUFU * g,
                                            alu_ops=_ADAMW_ALU * g, hbm_trips=1)))
    w1 = v.c["W1_WORDS"] * 4 * present
    ids = ((Staging("ids_ptr", read_bytes=P * T * 4, read_requests=P * lines(T * 4),
                    unique_bytes=T * 4),) if ids_staged else ())
    return Work((Programs(trips, trip, fixed), gains),
                hbm_bytes=T * D * 4 + T * 4 + T * 4 + V * D * present * 2 * _PMV_BYTES
                + g * (4 + 2 * _PMV_BYTES),
                extra_l2_bytes=missing_rows * (D * 4 + 4),
                staging=ids + staged + (Staging("w1_ptr", write_bytes=w1),))


# -- streams

@family("adamw")
def _adamw(v: View) -> Work:
    N, B, c = v.scalar("N"), v.c["BLOCK"], v.c
    P = v.programs
    excluded = (c["EMBED_END"] - c["EMBED_START"] + c["GAIN0_END"] - c["GAIN0_START"]
                + c["GAIN1_END"] - c["GAIN1_START"])
    w16 = (N - excluded) * 2
    # the doorbell (staging) → t → two float64 powers by 40 squarings, a division and a sqrt
    # (≈120 dependent ops), beside g, p, m, v in and p, m, v, bf16 p out; ~20 fp32 ops, a div_rn
    # and a sqrt_rn per element
    step = Step(load_bytes=B * 16, store_bytes=B * 12 + w16 / P, mufu_ops=3 * B, alu_ops=40 * B,
                serial_ops=120, hbm_trips=1, staging_trips=1)
    return Work((uniform(P, 1, step),), hbm_bytes=N * 4 * (3 * 2 + 1) + w16,
                staging=(Staging("doorbell_ptr", read_bytes=P * 4, read_requests=P, unique_bytes=4),))


@family("cast_bf16")
def _cast_bf16(v: View) -> Work:
    N, B = v.scalar("N"), v.c["BLOCK"]
    return Work((uniform(v.programs, 1, Step(load_bytes=B * 4, store_bytes=B * 2, alu_ops=B,
                                             hbm_trips=1)),), hbm_bytes=N * 6)


@family("copy_f32")
def _copy_f32(v: View) -> Work:
    N, B = v.scalar("N"), v.c["BLOCK"]
    staged = "dst_ptr" in v.staging_args()              # the writers copy device → staging
    step = Step(load_bytes=B * 4, store_bytes=0 if staged else B * 4, hbm_trips=1)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=N * 4 * (1 if staged else 2),
                staging=(Staging("dst_ptr", write_bytes=N * 4),) if staged else ())


@family("predictions")
def _predictions(v: View) -> Work:
    V = v.c["V"]
    step = Step(load_bytes=V * 4, alu_ops=8 * V, phases=3, hbm_trips=1)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=v.programs * V * 4,
                staging=(Staging("pred_ptr", write_bytes=v.programs * 8),))


@family(launches.RELEASE)
def _release(v: View) -> Work:
    # one thread: reads the doorbell (the device copy after the stage-in, or staging), then
    # fence.acq_rel.sys (a host round trip), 16 B out
    staged = "doorbell_ptr" in v.staging_args()
    step = Step(staging_trips=2 if staged else 1, l2_trips=0 if staged else 1)
    doorbell = ((Staging("doorbell_ptr", read_bytes=4, read_requests=1, unique_bytes=4),)
                if staged else ())
    return Work((uniform(v.programs, 1, step),), hbm_bytes=0,
                staging=doorbell + (Staging("slot_ptr", write_bytes=16),))


@family(launches.STAGE_IN)
def _release_stage_in(v: View) -> Work:
    # one block: every thread reads 2 × 16 B of the input record from staging (64 lines in
    # flight together: one round trip), stores them; thread 0 then reads the doorbell (a second
    # round trip), stores it, fence.acq_rel.sys (a third), 16 B of semaphore record out
    record = SL.INPUT_RECORD_BYTES
    step = Step(load_bytes=0, store_bytes=record + 4, staging_trips=3, alu_ops=record // 4)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=record + 4,
                staging=(Staging("record_ptr", read_bytes=record, read_requests=2 * record // 32,
                                 unique_bytes=record),
                         Staging("doorbell_ptr", read_bytes=4, read_requests=1, unique_bytes=4),
                         Staging("slot_ptr", write_bytes=16)))
