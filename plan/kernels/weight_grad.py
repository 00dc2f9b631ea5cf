"""Weight gradients with AdamW in their epilogue, beside a norm backward: one launch per layer half.

A product is llm.c's weight gradient of y = x @ Wᵀ, W (M = out, N = in): dW = dyᵀ @ x with
dy (T, M) and x (T, N) bf16 (A stored (K = T, M), B (K, N), NUMERICS `dW = bf(dy)ᵀ @ bf(x)`).
Its (BLOCK_M, BLOCK_N) tile of the gradient never leaves registers: the epilogue applies AdamW
(plan/kernels/adamw.py: NUMERICS §AdamW, the same fp32 operations in the same order as the
whole-plane update) to the same tile of P, M and V (every matrix decays) and stores bf(p) into the
bf16 copy.  So the launch must run after the last launch that reads the old bf16 weight (the dh/dx
product of the same weight); the launch lists place it there.

Grid: the tiles of product 0, then those of product 1 (PRODUCTS = 2), then cdiv(T, BLOCK_R) row
programs of a rmsnorm backward (dy = the split-K partials of the dh/dx product, summed in order),
then — for a gained norm (HAS_GAIN) — cdiv(D, GAIN_COLS) programs of its gain gradient.  The
programs share nothing: the norm reads dn, x, r (and g) and writes dx, dx16 (and dg), which no
product reads, and the products only write their own parameters' P/M/V and w16.
"""
import triton
import triton.language as tl

from plan.kernels.adamw import adamw_tile, bias_corrections
from plan.kernels.matmul import _accumulate, _tile_ids
from plan.kernels.norms import gain_cols, rmsnorm_bwd_rows


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
    # the epilogue in two column halves: fewer tiles of P/M/V (and their addresses) live at once
    HALF: tl.constexpr = BLOCK_N // 2
    g_lo, g_hi = tl.split(tl.permute(tl.reshape(g, (BLOCK_M, 2, HALF)), (0, 2, 1)))
    offs_h = pid_n * BLOCK_N + tl.arange(0, HALF)
    _adamw_half(g_lo, offs_m, offs_h, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
                DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
    _adamw_half(g_hi, offs_m, offs_h + HALF, p_ptr, w16_ptr, M, N, NPARAM, step_size, bc2_sqrt,
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
def weight_grad(a0_ptr, b0_ptr, p0_ptr, h0_ptr, a1_ptr, b1_ptr, p1_ptr, h1_ptr,
                dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, dg_ptr, doorbell_ptr, t_base,
                M0, N0, M1, N1, T, NPARAM,
                PRODUCTS: tl.constexpr, HAS_GAIN: tl.constexpr, ACCUMULATE: tl.constexpr,
                DY_PARTS: tl.constexpr, D: tl.constexpr,
                LR: tl.constexpr, BETA1_F64: tl.constexpr, BETA2_F64: tl.constexpr,
                DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                GAIN_ROWS: tl.constexpr, GAIN_COLS: tl.constexpr):
    """Products j < PRODUCTS: W_j (M_j, N_j) += AdamW(a_jᵀ @ b_j) at update count t_base +
    doorbell (p_j, h_j: W_j in the P plane and in w16; a_j (T, M_j), b_j (T, N_j) bf16).  Then the
    norm backward of T rows: dx [+]= rmsnorm_backward(Σ dy partials [·g]), dx16 = bf(dx); with
    HAS_GAIN also dg (D,) = Σ_rows dy·y.  (With PRODUCTS = 1 the a1 … h1 pointers are unread.)"""
    pid = tl.program_id(0)
    tiles0 = tl.cdiv(M0, BLOCK_M) * tl.cdiv(N0, BLOCK_N)
    if PRODUCTS == 2:
        tiles = tiles0 + tl.cdiv(M1, BLOCK_M) * tl.cdiv(N1, BLOCK_N)
    else:
        tiles = tiles0
    rows = tl.cdiv(T, BLOCK_R)
    if pid < tiles:
        # one code path for both products (one set of shared-memory buffers): pick the operands
        a_ptr, b_ptr, p_ptr, h_ptr, M, N, tile = a0_ptr, b0_ptr, p0_ptr, h0_ptr, M0, N0, pid
        if PRODUCTS == 2:
            if pid >= tiles0:
                a_ptr, b_ptr, p_ptr, h_ptr = a1_ptr, b1_ptr, p1_ptr, h1_ptr
                M, N, tile = M1, N1, pid - tiles0
        step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
        _dw_adamw(tile, a_ptr, b_ptr, p_ptr, h_ptr, M, N, T, NPARAM, step_size, bc2_sqrt,
                  DECAY, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS,
                  BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    elif pid < tiles + rows:
        rmsnorm_bwd_rows(pid - tiles, dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, T, D,
                         HAS_GAIN, ACCUMULATE, True, BLOCK_R, BLOCK_D, DY_PARTS)
    else:
        if HAS_GAIN:
            gain_cols(pid - tiles - rows, dy_ptr, x_ptr, rstd_ptr, dg_ptr, T, D, GAIN_ROWS,
                      GAIN_COLS, DY_PARTS)
