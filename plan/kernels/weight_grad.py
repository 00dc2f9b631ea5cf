"""Weight gradients with AdamW in their epilogue: one side-lane launch per layer half.

A product is llm.c's weight gradient of y = x @ Wᵀ, W (M = out, N = in): dW = dyᵀ @ x with
dy (T, M) and x (T, N) bf16 (A stored (K = T, M), B (K, N), NUMERICS `dW = bf(dy)ᵀ @ bf(x)`).
Its (BLOCK_M, BLOCK_N) tile of the gradient never leaves registers: the epilogue applies AdamW
(plan/kernels/adamw.py: NUMERICS §AdamW, the same fp32 operations in the same order as the
whole-plane update) to the same tile of P, M and V (every matrix decays) and stores bf(p) into the
bf16 copy.  So the launch must run after the last launch that reads the old bf16 weight (the dh/dx
product of the same weight); the launch lists fork it there, on the side lane of the update's
graph (plan/launches/graph.py).

Tiles: those of product 0, then those of product 1 (PRODUCTS = 2), in one numbering.  The grid
may be smaller than the tile count: program pid runs tiles pid, pid + programs, … in turn (each
tile by one program, with the same operations: the bits do not depend on the grid), so the side
lane holds no more SMs than its grid.  The bias corrections are formed once per program.

The epilogue works on column pieces of PIECE columns, each thread holding VEC consecutive elements
of a row: the layout each warp's rows of the accumulator convert to by shuffles alone, and one
16-byte access per plane (8 bytes for the bf16 copy), so no CTA-wide barrier.  A piece's P, M and
V are all loaded before any of its stores (in program order a load cannot pass a store to the same
buffer, so loading each plane after the last one's store made three dependent round trips a
piece): a tile's chain is one round trip a piece.  No piece is loaded ahead of the one being
updated: at 4 warps (plan/tuning.py) the accumulator holds 128 registers a thread and a piece in
flight 24 more, past what ptxas fits without a spill; two CTAs per SM overlap the chains instead.
"""
import triton
import triton.language as tl

from coppelius.plan.kernels.adamw import adamw_update, bias_corrections, load_pmv, store_pmv
from coppelius.plan.kernels.matmul import _accumulate, _tile_ids, col_pieces
from coppelius.plan.kernels.grid_dependency import await_previous_grid

PIECE = tl.constexpr(8)     # columns of one epilogue piece: a warp's 16 accumulator rows × 8
VEC = tl.constexpr(4)       # elements per thread and access: 16-byte fp32 loads and stores


@triton.jit
def _dw_adamw(pid, a_ptr, b_ptr, p_ptr, w16_ptr, M, N, K, NPARAM, step_size, bc2_sqrt,
              DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
              BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr):
    """Tile pid of g = bf(A)ᵀ-stored @ bf(B) (M, N), then AdamW on P/M/V (p_ptr: the parameter in
    the P plane; M and V planes NPARAM and 2·NPARAM further) and w16 = bf(p)."""
    tl.static_assert(BLOCK_N // PIECE * PIECE == BLOCK_N, "BLOCK_N: a multiple of PIECE")
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    g = _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, 0, K, True, False,
                    BLOCK_M, BLOCK_N, BLOCK_K)
    _adamw_epilogue(col_pieces(g, BLOCK_M, BLOCK_N, PIECE), offs_m, pid_n * BLOCK_N, p_ptr, w16_ptr,
                    M, N, NPARAM, step_size, bc2_sqrt, DECAY, BETA1, ONE_MINUS_BETA1, BETA2,
                    ONE_MINUS_BETA2, EPS, BLOCK_N // PIECE)


@triton.jit
def _piece(offs_m, col, M, N):
    """(offsets, mask) of the piece whose first column is col.  Its columns are written as runs
    of VEC, so the compiler gives every access of the piece — the fp32 planes and the bf16 copy
    alike — VEC elements per thread in one layout (a bf16 run of 8 would get its own layout, and
    the fp32 values an exchange through shared memory with CTA-wide barriers to reach it)."""
    lane = tl.arange(0, PIECE)
    cols = col + (lane // VEC) * VEC + lane % VEC
    return offs_m[:, None] * N + cols[None, :], (offs_m[:, None] < M) & (cols[None, :] < N)


@triton.jit
def _adamw_epilogue(parts, offs_m, col0, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                    DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                    BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
                    PIECES: tl.constexpr):
    """AdamW on the tile's pieces (g in registers, `parts`) from column col0, left to right, each
    loaded whole before it is stored (the module docstring); a piece wholly past column N is
    skipped (the last column tile of an N that is not a multiple of BLOCK_N), which also keeps
    the compiler from computing every piece's g products at the top of the epilogue, where
    they would hold registers through it (the tiny profile's one-stage build spilled so).  Per
    element the same fp32 operations in the same order (adamw_update: m, v, then p, decayed
    first; every matrix decays)."""
    for i in tl.static_range(PIECES):
        if col0 + i * PIECE < N:
            offs, mask = _piece(offs_m, col0 + i * PIECE, M, N)
            p, m, v = load_pmv(p_ptr, offs, mask, NPARAM)
            p, m, v = adamw_update(p * DECAY, m, v, parts[i], step_size, bc2_sqrt, BETA1,
                                   ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
            store_pmv(p_ptr, offs, mask, NPARAM, p, m, v)
            tl.store(w16_ptr + offs, p.to(tl.bfloat16), mask=mask)


@triton.jit
def weight_grad(a0_ptr, b0_ptr, p0_ptr, h0_ptr, a1_ptr, b1_ptr, p1_ptr, h1_ptr, doorbell_ptr, t_base,
                M0, N0, M1, N1, T, NPARAM,
                PRODUCTS: tl.constexpr,
                LR: tl.constexpr, BETA1_F64: tl.constexpr, BETA2_F64: tl.constexpr,
                DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """Products j < PRODUCTS: W_j (M_j, N_j) += AdamW(a_jᵀ @ b_j) at update count t_base +
    doorbell (p_j, h_j: W_j in the P plane and in w16; a_j (T, M_j), b_j (T, N_j) bf16).  (With
    PRODUCTS = 1 the a1 … h1 pointers are unread.)"""
    await_previous_grid(PDL)
    tiles0 = tl.cdiv(M0, BLOCK_M) * tl.cdiv(N0, BLOCK_N)
    if PRODUCTS == 2:
        tiles = tiles0 + tl.cdiv(M1, BLOCK_M) * tl.cdiv(N1, BLOCK_N)
    else:
        tiles = tiles0
    step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
    for pid in range(tl.program_id(0), tiles, tl.num_programs(0)):
        # one code path for both products (one set of shared-memory buffers): pick the operands
        a_ptr, b_ptr, p_ptr, h_ptr, M, N, tile = a0_ptr, b0_ptr, p0_ptr, h0_ptr, M0, N0, pid
        if PRODUCTS == 2:
            if pid >= tiles0:
                a_ptr, b_ptr, p_ptr, h_ptr = a1_ptr, b1_ptr, p1_ptr, h1_ptr
                M, N, tile = M1, N1, pid - tiles0
        _dw_adamw(tile, a_ptr, b_ptr, p_ptr, h_ptr, M, N, T, NPARAM, step_size, bc2_sqrt,
                  DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS,
                  BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
