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

from cost_inputs import EMBED_CHAIN, LINE  # noqa: E402
from plan import launches  # noqa: E402
from plan.attention_split import AttentionSplit  # noqa: E402
from plan.buffers import DTYPE_BYTES  # noqa: E402


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
    a, b = v.elem("a_ptr"), v.elem("b_ptr")
    tiles = _tiles(v, M, N, BM, BN)
    e = BM * BN
    # epilogue per tile: (aux loaded, c stored, MUFU, ALU) — meta.EPI_* codes
    aux, out, mufu, alu = {0: (0, 4 * e, 0, e), 1: (0, 2 * e, 0, 2 * e), 2: (4 * e, 4 * e, 0, 2 * e),
                           # SwiGLU backward: [a|b] fp32 in, [da|db] bf16 out; exp + 2 div_rn
                           3: (8 * e, 4 * e, 3 * e, 30 * e)}[epi]
    fixed = Step(load_bytes=aux, store_bytes=out, mufu_ops=mufu, alu_ops=alu, hbm_trips=1)
    c_unique = M * N * (4 if epi in (0, 2) else 2) * (2 if epi == 3 else 1)
    aux_unique = {0: 0, 1: 0, 2: M * N * 4, 3: 2 * M * N * 4}[epi]
    return Work((uniform(tiles, cdiv(K, BK), _mm_step(v, BM, BN, BK, a, b), fixed),),
                hbm_bytes=M * K * a + K * N * b + c_unique + aux_unique)


def _norm_prologue(v: View, products: int, gain: bool, epilogue: Step, out_unique: float) -> Work:
    """matmul_rotary / _swiglu / _norm: each program sums its rows' squares over K (one pass of
    fp32 loads), then reloads the fp32 rows, scales and rounds them as the A operand (fp32 A read
    twice per column tile); programs of column tile 0 store h16 and rstd."""
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    x, w = v.elem("x_ptr"), v.elem("w_ptr" if "w_ptr" in v.args else "wg_ptr")
    tiles = _tiles(v, M, N, BM, BN)
    main = _mm_step(v, BM, BN, BK, x, w, products, alu=(3 if gain else 2) * BM * BK)
    step = dataclasses.replace(main, load_bytes=BM * BK * x + main.load_bytes + (BK * 4 if gain else 0),
                               alu_ops=2 * BM * BK + main.alu_ops)                  # rstd pass + main
    fixed = Step(load_bytes=epilogue.load_bytes, store_bytes=epilogue.store_bytes,
                 mufu_ops=epilogue.mufu_ops + BM, alu_ops=epilogue.alu_ops + 20 * BM,
                 phases=1, hbm_trips=1)                                             # + rstd of BM rows
    h16_rstd = M * K * 2 + M * 4
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * x + products * N * K * w + (K * 4 if gain else 0) + h16_rstd
                + out_unique, extra_l2_bytes=h16_rstd)


@family("matmul_rotary")
def _matmul_rotary(v: View) -> Work:
    M, N, d = v.scalar("M"), v.scalar("N"), v.c["HEAD_DIM"]
    BM, BN = v.c["BLOCK_M"], v.c["BLOCK_N"]
    # rope [cos|sin] rows in, rotation (~6 ops per element), bf16 q'|k'|v out
    epi = Step(load_bytes=BM * d * 4, store_bytes=BM * BN * 2, alu_ops=6 * BM * BN)
    return _norm_prologue(v, 1, False, epi, out_unique=M * N * 2 + M * d * 4)


@family("matmul_swiglu")
def _matmul_swiglu(v: View) -> Work:
    M, N = v.scalar("M"), v.scalar("N")
    BM, BN = v.c["BLOCK_M"], v.c["BLOCK_N"]
    # ab = [a|b] fp32 and z = bf(silu(a)·b) out: exp + div_rn per element
    epi = Step(store_bytes=BM * BN * (8 + 2), mufu_ops=2 * BM * BN, alu_ops=15 * BM * BN)
    return _norm_prologue(v, 2, False, epi, out_unique=M * N * (8 + 2))


@family("matmul_norm")
def _matmul_norm(v: View) -> Work:
    M, N = v.scalar("M"), v.scalar("N")
    BM, BN = v.c["BLOCK_M"], v.c["BLOCK_N"]
    epi = Step(store_bytes=BM * BN * 4, alu_ops=BM * BN)
    return _norm_prologue(v, 1, True, epi, out_unique=M * N * 4)


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
    return Work((uniform(v.programs, 1, _norm_rows(D, R, gain, acc, bf16)),),
                hbm_bytes=_norm_rows_unique(T, D, gain, acc, bf16))


def _norm_rows(D, R, gain, acc, bf16) -> Step:
    """dy, x, r (and g, and the dx accumulated into) in; dx (and bf(dx)) out; a row reduction."""
    rows = R * D * 4
    return Step(load_bytes=2 * rows + R * 4 + (D * 4 if gain else 0) + (rows if acc else 0),
                store_bytes=rows + (R * D * 2 if bf16 else 0), alu_ops=8 * R * D, mufu_ops=R,
                phases=1, hbm_trips=1)


def _norm_rows_unique(T, D, gain, acc, bf16) -> float:
    return T * D * 4 * (3 + (1 if acc else 0)) + T * 4 + (D * 4 if gain else 0) \
        + (T * D * 2 if bf16 else 0)


@family("rmsnorm_bwd_gain")
def _rmsnorm_bwd_gain(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    GR, GC, bf16 = v.c["GAIN_ROWS"], v.c["GAIN_COLS"], v.c["WRITE_BF16"]
    rows, cols = cdiv(T, R), cdiv(D, GC)
    if v.programs != rows + cols:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid}, expected {rows} + {cols}")
    # gain programs: T/GAIN_ROWS trips of (r, x, dy) chunks, each a column sum, no prefetch
    gain = Step(load_bytes=GR * 4 + 2 * GR * GC * 4, alu_ops=3 * GR * GC, phases=1, l2_trips=1)
    return Work((uniform(rows, 1, _norm_rows(D, R, True, False, bf16)),
                 uniform(cols, cdiv(T, GR), gain, Step(store_bytes=GC * 4, hbm_trips=1))),
                hbm_bytes=_norm_rows_unique(T, D, True, False, bf16) + D * 4)


@family("cross_entropy")
def _cross_entropy(v: View) -> Work:
    T, V, R = v.scalar("T"), v.c["V"], v.c["ROWS"]
    e = R * V
    # one fp32 logits row in, bf16 dlogits out; exp, two div_rn per element; max/sum/pick reductions
    step = Step(load_bytes=e * 4, store_bytes=e * 2, mufu_ops=3 * e, alu_ops=30 * e, phases=3,
                hbm_trips=1, staging_trips=1)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=T * V * (4 + 2),
                staging=(Staging("targets_ptr", read_bytes=T * 4, read_requests=v.programs,
                                 unique_bytes=T * 4),
                         Staging("loss_ptr", write_bytes=T * 4), Staging("w0_ptr", write_bytes=T * 4)))


@family("embed_fwd")
def _embed_fwd(v: View) -> Work:
    T, D, R, d = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["HEAD_DIM"]
    P = v.programs
    # own ids (twice: gather and links) and all T ids (links) from staging, then the rows
    # gathered (dependent), rmsnorm, the rope rows in float64 (sin/cos ≈ 40 dependent ops)
    step = Step(load_bytes=R * D * 4 + D * 4,
                store_bytes=2 * R * D * 4 + R * 4 + R * d * 4 + R * 4,
                mufu_ops=R, alu_ops=6 * R * D + 3 * R * T + 80 * R * d, phases=2, serial_ops=80,
                hbm_trips=1, staging_trips=1)
    per = 2 * R * 4 + T * 4
    return Work((uniform(P, 1, step),),
                hbm_bytes=T * D * 4 * 3 + D * 4 + T * 4 + T * d * 4 + T * 4,
                staging=(Staging("ids_ptr", read_bytes=P * per,
                                 read_requests=P * (2 * lines(R * 4) + lines(T * 4)),
                                 unique_bytes=T * 4),))


@family("embed_grad")
def _embed_grad(v: View) -> Work:
    T, V, D, BV = v.scalar("T"), v.scalar("V"), v.c["D"], v.c["BLOCK_V"]
    P = v.programs
    # every program reads all T ids (staging) and compares them with its BLOCK_V ids, then walks
    # the chains: one dependent trip per occurrence of its most frequent id (program 0 holds the
    # markers: EMBED_CHAIN trips; the others one) — a de row and a next-row link per trip
    trip = Step(load_bytes=D * 4 + 4, alu_ops=4 * BV * D, phases=1, l2_trips=1)
    fixed = Step(store_bytes=BV * D * 4, alu_ops=3 * BV * T, phases=1, staging_trips=1)
    trips = (EMBED_CHAIN,) + (1,) * (P - 1)
    missing_rows = max(0, T - sum(trips))             # de rows read in trips not modelled
    w1 = v.c["W1_WORDS"] * 4
    return Work((Programs(trips, trip, fixed),),
                hbm_bytes=T * D * 4 + T * 4 + V * D * 4,
                extra_l2_bytes=missing_rows * (D * 4 + 4),
                staging=(Staging("ids_ptr", read_bytes=P * T * 4, read_requests=P * lines(T * 4),
                                 unique_bytes=T * 4),
                         Staging("w1_ptr", write_bytes=w1)))


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
    # one thread: reads the doorbell, fence.acq_rel.sys (a second host round trip), 16 B out
    step = Step(staging_trips=2)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=0,
                staging=(Staging("doorbell_ptr", read_bytes=4, read_requests=1, unique_bytes=4),
                         Staging("slot_ptr", write_bytes=16)))
