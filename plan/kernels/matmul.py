"""Matmuls: bf16 operands, fp32 accumulation (tl.dot → wgmma on sm_90a, mma on sm_80), fused epilogues.

One kernel covers every matrix product of the model through two layout flags:
  A_T = False: A stored (M, K) row-major      A_T = True: A stored (K, M) row-major (Aᵀ is read)
  B_T = True:  B stored (N, K) row-major (a `[out, in]` weight read as Wᵀ)
  B_T = False: B stored (K, N) row-major
so `h @ Wᵀ` is (A_T=0, B_T=1), `dY @ W` is (0, 0) and the weight gradient `dYᵀ @ h` is (1, 0).
`matmul_swiglu` computes the gate and up products of one tile together and applies SwiGLU, on
the bf16 output of a `rmsnorm_rows` launch (plan/kernels/norms.py; as the head reads the final
norm's): its 43 column tiles of 64 would each re-read the fp32 rows in a fused prologue.
`matmul_rotary` is the qkv product with rotary in its epilogue (bf16 q'|k'|v out, no fp32 scratch),
on the bf16 rows of the attention norm: `residual_norm` (after the previous layer's split mlp
down) or `embed_fwd` (layer 0) wrote them once, where a fused prologue would read the fp32 rows
once per column tile.
`matmul_residual` (out_proj) also writes per-row partial sums of squares for the MLP norm.
`matmul_delta` is out_proj_backward's dO product that also forms delta = rowsum(dO·o) per head.
The epilogues fuse what used to be separate launches with the same fp32 operations in the same
order, so the rounding points of NUMERICS.md do not move.
Operands are rounded to bf16 on load (a no-op for bf16 buffers), exactly bf() of NUMERICS.md.
"""
import triton
import triton.language as tl

from coppelius.plan.kernels import meta
from coppelius.plan.kernels.rotary import load_rope, rotate_tile
from coppelius.plan.kernels.grid_dependency import await_previous_grid

EPI_F32 = tl.constexpr(meta.EPI_F32)
EPI_BF16 = tl.constexpr(meta.EPI_BF16)
EPI_RESIDUAL = tl.constexpr(meta.EPI_RESIDUAL)
EPI_SWIGLU_BWD = tl.constexpr(meta.EPI_SWIGLU_BWD)
PIECE_SPLITS = tl.constexpr(8)    # halvings col_pieces may make (BLOCK_N ≤ 256 · its width)
SWIGLU_PIECE = tl.constexpr(16)   # columns of a SwiGLU-backward epilogue piece (8 bf16 a thread)
SWIGLU_AHEAD = tl.constexpr(1)    # … pieces of [a | b] in flight ahead (ptxas sm_90a: 111
#                                   registers; 2: 122, 3: 126, all: 160; 2 CTAs/SM need ≤ 128)


@triton.jit
def _tile_ids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped ordering: GROUP_M row tiles share their B tiles in L2; pid counts the tiles of one
    # product from 0
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


# The weight gradient's operand forms (A stored (K, M), B stored (K, N)) add one summed offset to
# the base pointer: a pointer stepped by the K-row offset alone is the same for every tile, and
# in a kernel that loops over tiles (weight_grad) the compiler hoists each thread's row pointers
# out of that loop and holds them through the epilogue (the one-product weight gradient at 4
# warps spilled so).  The other forms keep the two steps (summed, matmul_swiglu's sm_80 build
# takes 162 registers, not 128).
@triton.jit
def _load_a(a_ptr, offs_m, offs_k, M, K, A_T: tl.constexpr):
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    if A_T:
        a = tl.load(a_ptr + (offs_k[None, :] * M + offs_m[:, None]), mask=mask, other=0.0)
    else:
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
    return a.to(tl.bfloat16)                                        # (BLOCK_M, BLOCK_K)


@triton.jit
def _load_b(b_ptr, offs_k, offs_n, N, K, B_T: tl.constexpr):
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    if B_T:
        b = tl.load(b_ptr + offs_n[None, :] * K + offs_k[:, None], mask=mask, other=0.0)
    else:
        b = tl.load(b_ptr + (offs_k[:, None] * N + offs_n[None, :]), mask=mask, other=0.0)
    return b.to(tl.bfloat16)                                        # (BLOCK_K, BLOCK_N)


@triton.jit
def _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, k_lo, k_hi, A_T: tl.constexpr,
                B_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """acc (BLOCK_M, BLOCK_N) fp32 = bf(A) @ bf(B) over k in [k_lo, k_hi) (k_lo a multiple of
    BLOCK_K), in increasing k."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = _load_a(a_ptr, offs_m, k0 + offs_k, M, K, A_T)
        b = _load_b(b_ptr, k0 + offs_k, offs_n, N, K, B_T)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def store_ssq(ssq_ptr, x, offs_m, M, part):
    """ssq[part, m] = Σ_n x[m, n]² of a residual tile x (BLOCK_M, BLOCK_N) (columns past N hold 0):
    the partial sum its consumer's norm prologue adds in part order."""
    tl.store(ssq_ptr + part * M + offs_m, tl.sum(x * x, 1), mask=offs_m < M)


@triton.jit
def _col_halves(x, BLOCK_M: tl.constexpr, HALF: tl.constexpr):
    """The two column halves (BLOCK_M, HALF) of a tile x (BLOCK_M, 2·HALF)."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, HALF)), (0, 2, 1)))


@triton.jit
def _col_quarters(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The four column quarters (BLOCK_M, BLOCK_N / 4) of a tile x (BLOCK_M, BLOCK_N), left to
    right: an epilogue that works on eighths takes each quarter's two halves in turn."""
    lo, hi = _col_halves(x, BLOCK_M, BLOCK_N // 2)
    q0, q1 = _col_halves(lo, BLOCK_M, BLOCK_N // 4)
    q2, q3 = _col_halves(hi, BLOCK_M, BLOCK_N // 4)
    return q0, q1, q2, q3


@triton.jit
def col_pieces(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """The column pieces (BLOCK_M, WIDTH) of a tile x (BLOCK_M, BLOCK_N), left to right, as a
    tuple (x halved in turn; BLOCK_N / WIDTH a power of two ≤ 2^PIECE_SPLITS)."""
    parts = (x,)
    for level in tl.static_range(PIECE_SPLITS):
        if (BLOCK_N >> level) > WIDTH:
            halves = ()
            for i in tl.static_range(1 << level):
                lo, hi = _col_halves(parts[i], BLOCK_M, BLOCK_N >> (level + 1))
                halves = halves + (lo, hi)
            parts = halves
    return parts


@triton.jit
def _swiglu_bwd_load(aux_ptr, offs_m, offs_n, M, N):
    """[a | b] (M, 2N) bf16 saved by the forward, of columns offs_n: (ga, up) fp32."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    row = offs_m[:, None] * (2 * N)
    ga = tl.load(aux_ptr + row + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    up = tl.load(aux_ptr + row + N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return ga, up


@triton.jit
def _swiglu_bwd_cols(dz, ga, up, c_ptr, offs_m, offs_n, M, N):
    """dz (BLOCK_M, cols) of the SwiGLU backward on its (ga, up) (_swiglu_bwd_load); writes
    [bf(da) | bf(db)] of those columns (NUMERICS mlp_backward)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    row = offs_m[:, None] * (2 * N)
    ea = 1.0 + tl.exp(-ga)
    sig = tl.div_rn(1.0, ea)
    silu = tl.div_rn(ga, ea)
    dsilu = sig * (1.0 + ga * (1.0 - sig))
    da = dz * up * dsilu
    db = dz * silu
    tl.store(c_ptr + row + offs_n[None, :], da.to(tl.bfloat16), mask=mask)
    tl.store(c_ptr + row + N + offs_n[None, :], db.to(tl.bfloat16), mask=mask)


@triton.jit
def _swiglu_bwd(acc, c_ptr, aux_ptr, offs_m, col0, M, N, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """The SwiGLU backward epilogue of a tile (dz = acc) from column col0, in pieces of
    SWIGLU_PIECE columns, piece i + SWIGLU_AHEAD's [a | b] loaded before piece i's stores: a
    load cannot pass a store in program order, so loading each piece after the last one's
    stores made a dependent round trip a piece (1 + 8 a tile; now 1 + 4).  Every piece loaded
    first would make it 1 + 1 but hold 160 registers (1 CTA per SM, not 2: docs/performance/
    update-levers-round-6.md)."""
    tl.static_assert(BLOCK_N // SWIGLU_PIECE * SWIGLU_PIECE == BLOCK_N,
                     "BLOCK_N: a multiple of SWIGLU_PIECE")
    PIECES: tl.constexpr = BLOCK_N // SWIGLU_PIECE
    parts = col_pieces(acc, BLOCK_M, BLOCK_N, SWIGLU_PIECE)
    cols = col0 + tl.arange(0, SWIGLU_PIECE)
    loaded = ()
    for i in tl.static_range(SWIGLU_AHEAD):
        loaded = loaded + (_swiglu_bwd_load(aux_ptr, offs_m, cols + i * SWIGLU_PIECE, M, N),)
    for i in tl.static_range(PIECES):
        if i + SWIGLU_AHEAD < PIECES:
            ahead = cols + (i + SWIGLU_AHEAD) * SWIGLU_PIECE
            loaded = loaded + (_swiglu_bwd_load(aux_ptr, offs_m, ahead, M, N),)
        ga, up = loaded[i]
        _swiglu_bwd_cols(parts[i], ga, up, c_ptr, offs_m, cols + i * SWIGLU_PIECE, M, N)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, aux_ptr, M, N, K,
           A_T: tl.constexpr, B_T: tl.constexpr, EPILOGUE: tl.constexpr, SPLIT_K: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """c (M, N) = epilogue(bf(A) @ bf(B)); aux: the residual (M, N) or [a | b] (M, 2N) for SwiGLU.

    SPLIT_K > 1 (EPI_F32 only): grid = tiles × SPLIT_K; program `split · tiles + tile` sums the
    split-th of the K chunks (cdiv(chunks, SPLIT_K) each, the last ones may be short or empty)
    and stores its partial to c + split·M·N: c is (SPLIT_K, M, N), and the consumer adds the
    partials in split order (a fixed order: no atomics)."""
    await_previous_grid(PDL)
    pid = tl.program_id(0)
    if SPLIT_K == 1:
        pid_m, pid_n = _tile_ids(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_lo = 0
        k_hi = K
    else:
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        split = pid // tiles
        pid_m, pid_n = _tile_ids(pid % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = split * per
        k_hi = tl.minimum(k_lo + per, K)
        c_ptr += split * M * N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, k_lo, k_hi, A_T, B_T,
                      BLOCK_M, BLOCK_N, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if EPILOGUE == EPI_SWIGLU_BWD:
        _swiglu_bwd(acc, c_ptr, aux_ptr, offs_m, pid_n * BLOCK_N, M, N, BLOCK_M, BLOCK_N)
    else:
        offs_c = offs_m[:, None] * N + offs_n[None, :]
        if EPILOGUE == EPI_RESIDUAL:
            acc = tl.load(aux_ptr + offs_c, mask=mask, other=0.0) + acc
        if EPILOGUE == EPI_BF16:
            tl.store(c_ptr + offs_c, acc.to(tl.bfloat16), mask=mask)
        else:
            tl.store(c_ptr + offs_c, acc, mask=mask)


@triton.jit
def matmul_residual(a_ptr, b_ptr, x_ptr, out_ptr, ssq_ptr, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """out (M, N) = x + bf(A) @ bf(B)ᵀ (A (M, K), B (N, K): out_proj, mlp down), the residual
    stream; and ssq (cdiv(N, BLOCK_N), M): each column tile's per-row Σ out², which the next norm
    prologue adds up instead of re-reading the rows (NUMERICS out_proj / mlp)."""
    await_previous_grid(PDL)
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, 0, K, False, True,
                      BLOCK_M, BLOCK_N, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None] * N + offs_n[None, :]
    out = tl.load(x_ptr + offs, mask=mask, other=0.0) + acc
    tl.store(out_ptr + offs, out, mask=mask)
    store_ssq(ssq_ptr, out, offs_m, M, pid_n)


@triton.jit
def matmul_swiglu(h16_ptr, wg_ptr, wu_ptr, ab_ptr, z_ptr, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """h16 (M, K) = bf(rmsnorm(x)) (rmsnorm_rows wrote it); a = h16 @ bf(Wgate)ᵀ,
    b = h16 @ bf(Wup)ᵀ (M, N), each rounded to bf16 (NUMERICS mlp): ab = [bf(a) | bf(b)]
    (M, 2N) bf16, z = bf(silu(bf(a))·bf(b)) — the values the backward differentiates."""
    await_previous_grid(PDL)
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        h = _load_a(h16_ptr, offs_m, k0 + offs_k, M, K, False)
        acc_a = tl.dot(h, _load_b(wg_ptr, k0 + offs_k, offs_n, N, K, True), acc_a)
        acc_b = tl.dot(h, _load_b(wu_ptr, k0 + offs_k, offs_n, N, K, True), acc_b)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    row = offs_m[:, None] * (2 * N)
    a16, b16 = acc_a.to(tl.bfloat16), acc_b.to(tl.bfloat16)
    tl.store(ab_ptr + row + offs_n[None, :], a16, mask=mask)
    tl.store(ab_ptr + row + N + offs_n[None, :], b16, mask=mask)
    ga, up = a16.to(tl.float32), b16.to(tl.float32)
    z = tl.div_rn(ga, 1.0 + tl.exp(-ga)) * up
    tl.store(z_ptr + offs_m[:, None] * N + offs_n[None, :], z.to(tl.bfloat16), mask=mask)


@triton.jit
def matmul_rotary(h16_ptr, w_ptr, qkv_ptr, rope_ptr, M, N, K,
                  ROTATED: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """qkv (M, N) bf16 = bf(rotary(h16 @ bf(W)ᵀ)), h16 (M, K) = bf(rmsnorm(x)) (a row launch wrote
    it): W = Wq|Wk|Wv (N = (H+2G)·d rows), the first ROTATED heads (q and k) rotated (NUMERICS
    qkv + rotary), v cast; rope (M, d) = [cos | sin] per row (embed_fwd writes it).  BLOCK_N holds
    whole heads."""
    await_previous_grid(PDL)
    HEADS_IN_TILE: tl.constexpr = BLOCK_N // HEAD_DIM
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _accumulate(h16_ptr, w_ptr, offs_m, offs_n, M, N, K, 0, K, False, True,
                      BLOCK_M, BLOCK_N, BLOCK_K)
    c, s = load_rope(rope_ptr, offs_m, M, HEAD_DIM)                  # (BLOCK_M, d/2)
    y = rotate_tile(acc, c, s, pid_n * HEADS_IN_TILE, ROTATED, HEADS_IN_TILE, HEAD_DIM, False)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(qkv_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(tl.bfloat16), mask=mask)


@triton.jit
def matmul_delta(a_ptr, b_ptr, do_ptr, o_ptr, delta_ptr, M, N, K, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """dO (M, N) fp32 = bf(A) @ bf(B) (A (M, K), B (K, N): dres @ Wo) and delta (N/d, M) =
    Σ_d dO·o per head (o (M, N) fp32, NUMERICS attention_backward).  BLOCK_N holds whole heads."""
    await_previous_grid(PDL)
    HEADS_IN_TILE: tl.constexpr = BLOCK_N // HEAD_DIM
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _accumulate(a_ptr, b_ptr, offs_m, offs_n, M, N, K, 0, K, False, False,
                      BLOCK_M, BLOCK_N, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs_c = offs_m[:, None] * N + offs_n[None, :]
    tl.store(do_ptr + offs_c, acc, mask=mask)
    prod = acc * tl.load(o_ptr + offs_c, mask=mask, other=0.0)
    delta = tl.sum(tl.reshape(prod, (BLOCK_M, HEADS_IN_TILE, HEAD_DIM)), 2)   # (BLOCK_M, heads)
    heads = pid_n * HEADS_IN_TILE + tl.arange(0, HEADS_IN_TILE)
    tl.store(delta_ptr + heads[None, :] * M + offs_m[:, None], delta,
             mask=(offs_m[:, None] < M) & (heads[None, :] < N // HEAD_DIM))
