"""Cost-model families of the matmul kernels (plan/kernels/matmul.py) and of the weight gradients
with AdamW in their epilogue (plan/kernels/weight_grad.py, the side lane)."""
from __future__ import annotations

from tools.cost.work import (PMV_BYTES, Programs, Step, View, Work, add_steps, cdiv, doorbell_read, family,
                   scale_step, uniform)


# -- matmuls: one program per (BLOCK_M, BLOCK_N) tile, a K loop of BLOCK_K trips (software
#    pipelined when num_stages > 1: the next chunks are in flight, so a trip waits on no load;
#    with one stage — the tiny profile — each trip waits for its chunks from L2: the PTX's
#    per-trip round trips, View.trip_trips).  The epilogue's dependent round trips and its
#    instructions are the PTX's too (View.tile_trips, View.tail_ops: the K loop's fill, then
#    each load the epilogue issues after a store or barrier that waited for an earlier one)

def _mm_step(v: View, BM, BN, BK, a_bytes, b_bytes, products=1, alu=0.0) -> Step:
    return Step(mma_flops=products * 2 * BM * BN * BK,
                load_bytes=BM * BK * a_bytes + products * BK * BN * b_bytes, alu_ops=alu, phases=1,
                l2_trips=v.trip_trips)


def _epilogue(v: View, load_bytes=0.0, store_bytes=0.0) -> Step:
    """A tile's epilogue: its bytes (the family's), its round trips, instructions and barriers
    (the PTX's)."""
    alu, mufu = v.tail_ops()
    return Step(load_bytes=load_bytes, store_bytes=store_bytes, mufu_ops=mufu, alu_ops=alu,
                phases=v.tail_bars, hbm_trips=v.tile_trips)


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
    ab = v.elem("aux_ptr") if epi == 3 else 0     # the forward's [a|b] (bf16)
    # epilogue per tile: (aux loaded, c stored) — meta.EPI_* codes; SwiGLU backward (3): [a|b]
    # in, [da|db] bf16 out
    aux, out = {0: (0, 4 * e), 1: (0, 2 * e), 2: (4 * e, 4 * e), 3: (2 * ab * e, 4 * e)}[epi]
    fixed = _epilogue(v, aux, out)
    c_unique = S * M * N * (4 if epi in (0, 2) else 2) * (2 if epi == 3 else 1)
    aux_unique = {0: 0, 1: 0, 2: M * N * 4, 3: 2 * M * N * ab}[epi]
    # split s of S sums chunks [s·per, (s+1)·per) of the cdiv(K, BK) chunks (the last may be short)
    chunks = cdiv(K, BK)
    per = cdiv(chunks, S)
    trips = tuple(max(0, min(per, chunks - s * per)) for s in range(S) for _ in range(tiles))
    return Work((Programs(trips, _mm_step(v, BM, BN, BK, a, b), fixed),),
                hbm_bytes=M * K * a + K * N * b + c_unique + aux_unique)


@family("matmul_residual")
def _matmul_residual(v: View) -> Work:
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    tiles = _tiles(v, M, N, BM, BN)
    e = BM * BN
    # epilogue: the residual tile in, x + acc out, and its per-row Σ x² (a row reduction) out
    fixed = _epilogue(v, 4 * e, 4 * e + 4 * BM)
    return Work((uniform(tiles, cdiv(K, BK), _mm_step(v, BM, BN, BK, v.elem("a_ptr"),
                                                      v.elem("b_ptr")), fixed),),
                hbm_bytes=M * K * 2 + K * N * 2 + 2 * M * N * 4 + cdiv(N, BN) * M * 4)


@family("matmul_rotary")
def _matmul_rotary(v: View) -> Work:
    """The bf16 norm rows h16 (a row launch wrote them) @ Wqkvᵀ, rotary in the epilogue."""
    M, N, K, d = v.scalar("M"), v.scalar("N"), v.scalar("K"), v.c["HEAD_DIM"]
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    h, w = v.elem("h16_ptr"), v.elem("w_ptr")
    tiles = _tiles(v, M, N, BM, BN)
    # rope [cos|sin] rows in, the rotation, bf16 q'|k'|v out
    fixed = _epilogue(v, BM * d * 4, BM * BN * 2)
    return Work((uniform(tiles, cdiv(K, BK), _mm_step(v, BM, BN, BK, h, w), fixed),),
                hbm_bytes=M * K * h + N * K * w + M * N * 2 + M * d * 4)


@family("matmul_swiglu")
def _matmul_swiglu(v: View) -> Work:
    M, N, K = v.scalar("M"), v.scalar("N"), v.scalar("K")
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    # two products of the bf16 h16 rmsnorm_rows wrote; ab = [bf(a)|bf(b)] and z = bf(silu(a)·b)
    # out: exp + div_rn per element
    tiles = _tiles(v, M, N, BM, BN)
    step = _mm_step(v, BM, BN, BK, v.elem("h16_ptr"), v.elem("wg_ptr"), 2)
    e, out = BM * BN, 2 * v.elem("ab_ptr") + v.elem("z_ptr")        # bytes stored per element
    fixed = _epilogue(v, 0, e * out)
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * 2 + 2 * N * K * v.elem("wg_ptr") + M * N * out)


@family("matmul_delta")
def _matmul_delta(v: View) -> Work:
    M, N, K, d = v.scalar("M"), v.scalar("N"), v.scalar("K"), v.c["HEAD_DIM"]
    BM, BN, BK = v.c["BLOCK_M"], v.c["BLOCK_N"], v.c["BLOCK_K"]
    tiles = _tiles(v, M, N, BM, BN)
    # dO out, o in (each at its buffer's element size), delta = Σ_d dO·o per head (a reduction
    # over d, of the fp32 product)
    do, o = v.elem("do_ptr"), v.elem("o_ptr")
    fixed = _epilogue(v, BM * BN * o, BM * BN * do + BM * (BN // d) * 4)
    step = _mm_step(v, BM, BN, BK, v.elem("a_ptr"), v.elem("b_ptr"))
    return Work((uniform(tiles, cdiv(K, BK), step, fixed),),
                hbm_bytes=M * K * 2 + K * N * 2 + M * N * (do + o) + M * N // d * 4)


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
    start, staged = doorbell_read(v, P)
    # K = T loop of bf16 dy and x chunks; the epilogue reads P, M, V of the tile and writes them
    # and w16 (the gradient never leaves registers): AdamW's instructions and its chain of
    # dependent round trips (each column piece's P, M, V loaded after the last piece's stores:
    # 16 a 128×128 tile) as the PTX has them
    step = _mm_step(v, BM, BN, BK, v.elem("a0_ptr"), v.elem("b0_ptr"))
    epilogue = _epilogue(v, PMV_BYTES * e, (PMV_BYTES + 2) * e)
    more, base = tiles % P, tiles // P                  # the first `more` programs run base + 1
    groups = [uniform(n, k * cdiv(T, BK), step, add_steps(start, scale_step(epilogue, k)))
              for n, k in ((more, base + 1), (P - more, base)) if n]
    hbm = sum(T * M * 2 + T * N * 2 + M * N * (2 * PMV_BYTES + 2) for M, N in dims)
    return Work(tuple(groups), hbm_bytes=hbm, staging=staged)
