"""Weight gradients with AdamW in their epilogue: one side-lane launch per layer half.

A product is llm.c's weight gradient of y = x @ Wᵀ, W (M = out, N = in): dW = dyᵀ @ x with
dy (T, M) and x (T, N) bf16 (A stored (K = T, M), B (K, N), NUMERICS `dW = bf(dy)ᵀ @ bf(x)`).
Its (BLOCK_M, BLOCK_N) tile of the gradient never leaves registers: the epilogue applies AdamW
(plan/kernels/adamw.py: NUMERICS §AdamW, the same fp32 operations in the same order as the
whole-plane update) to the same tile of P, M and V (every matrix decays) and stores bf(p) into the
bf16 copy.  So the launch must run after the last launch that reads the old bf16 weight (the dh/dx
product of the same weight); the launch lists fork it there, on the side lane of the update's
graph (plan/launch_graph.py).

Tiles: those of product 0, then those of product 1 (PRODUCTS = 2), in one numbering.  The grid
may be smaller than the tile count: program pid runs tiles pid, pid + programs, … in turn (each
tile by one program, with the same operations: the bits do not depend on the grid), so the side
lane holds no more SMs than its grid.  The bias corrections are formed once per program.
"""
import triton
import triton.language as tl

from plan.kernels.adamw import adamw_tile, bias_corrections
from plan.kernels.matmul import _accumulate, _col_halves, _col_quarters, _tile_ids
from plan.kernels.grid_dependency import await_previous_grid


@triton.jit
def _dw_adamw(pid, a_ptr, b_ptr, p_ptr, w16_ptr, M, N, K, NPARAM, step_size, bc2_sqrt,
              DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
              BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr):
    """Tile pid of g = bf(A)ᵀ-stored @ bf(B) (M, N), then AdamW on P/M/V (p_ptr: the parameter in
    the P plane; M and V planes NPARAM and 2·NPARAM further) and w16 = bf(p)."""
    pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    g = _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, 0, K, True, False,
                    BLOCK_M, BLOCK_N, BLOCK_K)
    # the epilogue in column eighths: fewer tiles of P/M/V (and their addresses) live at once
    # (coppelius sm_90a: 128×128 in halves 236–248 registers, in eighths 158–178; 128×256 in
    # eighths 250 — docs/PERFORMANCE.md, issue 14 round 5)
    HALF: tl.constexpr = BLOCK_N // 2
    QUARTER: tl.constexpr = BLOCK_N // 4
    EIGHTH: tl.constexpr = BLOCK_N // 8
    g_0, g_1, g_2, g_3 = _col_quarters(g, BLOCK_M, BLOCK_N)
    offs_e = pid_n * BLOCK_N + tl.arange(0, EIGHTH)              # an eighth's columns
    _adamw_halves(g_0, offs_m, offs_e, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                  DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS, BLOCK_M, EIGHTH)
    _adamw_halves(g_1, offs_m, offs_e + QUARTER, p_ptr, w16_ptr, M, N, NPARAM, step_size,
                  bc2_sqrt, DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS, BLOCK_M,
                  EIGHTH)
    _adamw_halves(g_2, offs_m, offs_e + HALF, p_ptr, w16_ptr, M, N, NPARAM, step_size,
                  bc2_sqrt, DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS, BLOCK_M,
                  EIGHTH)
    _adamw_halves(g_3, offs_m, offs_e + HALF + QUARTER, p_ptr, w16_ptr, M, N, NPARAM, step_size,
                  bc2_sqrt, DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS, BLOCK_M,
                  EIGHTH)


@triton.jit
def _adamw_halves(g, offs_m, offs_n, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                  DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                  BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
                  BLOCK_M: tl.constexpr, HALF: tl.constexpr):
    """_adamw_half on the two column halves of g (BLOCK_M, 2·HALF); offs_n (HALF,) the first
    half's columns."""
    lo, hi = _col_halves(g, BLOCK_M, HALF)
    _adamw_half(lo, offs_m, offs_n, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
    _adamw_half(hi, offs_m, offs_n + HALF, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)


@triton.jit
def _adamw_half(g, offs_m, offs_n, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None] * N + offs_n[None, :]
    p = adamw_tile(p_ptr, offs, mask, g, NPARAM, step_size, bc2_sqrt, True, DECAY, BETA1,
                   ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
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
