"""Row norms: embedding gather + rmsnorm + gain (also the rotary table and next-row links), the
rmsnorm backward, and the gain gradients (a
fixed-order column reduction over rows: no atomics).  Every forward rmsnorm writes its bf16
output once for the matmul that reads it: `rmsnorm_rows` at the MLP sites, r from out_proj's
partial sums of squares (`ssq_rstd`); `embed_fwd` the first attention site's, and
`residual_norm` after each mlp down, which first adds the down's split-K partials to the
residual, then forms r from the whole row (the next layer's attention norm, or the final norm
with its gain).

One program owns BLOCK_R whole rows (BLOCK_D ≥ D covers a row), so every row statistic is a
single in-register reduction.  y = x·r is recomputed from the saved x and r (same fp32 ops as the
forward), never stored.
"""
import triton
import triton.language as tl

from coppelius.plan.kernels import meta
from coppelius.plan.kernels.embed_grad import store_next_rows
from coppelius.plan.kernels.rotary import store_rope
from coppelius.plan.kernels.grid_dependency import await_previous_grid

RMS_EPS = tl.constexpr(meta.RMS_EPS)


@triton.jit
def _row_block(T, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's BLOCK_R whole rows of a (T, D) row-major array: offs_r (BLOCK_R,), offs_d
    (BLOCK_D,), mask_r, mask (BLOCK_R, BLOCK_D) and the element offsets offs (BLOCK_R, BLOCK_D)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < T
    mask = mask_r[:, None] & (offs_d[None, :] < D)
    return offs_r, offs_d, mask_r, mask, offs_r[:, None] * D + offs_d[None, :]


@triton.jit
def _rstd(x, D: tl.constexpr):
    # r = 1/sqrt(mean(x²) + eps), IEEE division and square root as numpy does
    ms = tl.div_rn(tl.sum(x * x, 1), tl.full((), D, tl.float32))
    return tl.div_rn(tl.full((), 1.0, tl.float32), tl.sqrt_rn(ms + RMS_EPS))


@triton.jit
def ssq_rstd(ssq_ptr, offs_m, M, K, SSQ_PARTS: tl.constexpr):
    """r (BLOCK_M,) = 1/sqrt(mean(x²) + eps) of the rows offs_m of an fp32 residual x (M, K) from
    its producer's per-row partial sums of squares ssq (SSQ_PARTS, M) — one per column tile of
    the producer, added in column-tile order (a fixed order) — IEEE division and square root as
    rmsnorm does.  The fused norm prologues so read x only once, as their A operand."""
    ss = load_parts(ssq_ptr, offs_m, offs_m < M, M, SSQ_PARTS)
    ms = tl.div_rn(ss, K.to(tl.float32))
    return tl.div_rn(tl.full((), 1.0, tl.float32), tl.sqrt_rn(ms + RMS_EPS))


@triton.jit
def rmsnorm_rows(x_ptr, ssq_ptr, h16_ptr, rstd_ptr, T, D: tl.constexpr, SSQ_PARTS: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """h16 = bf(x·r) (T, D) and rstd = r (T,) of BLOCK_R whole rows of the fp32 residual x, r from
    its producer's SSQ_PARTS partial sums of squares: what matmul_swiglu's prologue would form
    per column tile, formed once (NUMERICS rmsnorm)."""
    await_previous_grid(PDL)
    offs_r, offs_d, mask_r, mask, offs = _row_block(T, D, BLOCK_R, BLOCK_D)
    r = ssq_rstd(ssq_ptr, offs_r, T, tl.full((), D, tl.int32), SSQ_PARTS)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(h16_ptr + offs, (x * r[:, None]).to(tl.bfloat16), mask=mask)
    tl.store(rstd_ptr + offs_r, r, mask=mask_r)


@triton.jit
def embed_fwd(ids_ptr, table_ptr, g_ptr, emb_ptr, rstd_ptr, x_ptr, h16_ptr, rstd0_ptr, rope_ptr,
              next_ptr, T, V: tl.constexpr, D: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
              PDL: tl.constexpr = False):
    """e = E[ids] (T, D) → emb = e, rstd = r(e), x = e·r·g (NUMERICS embed), and the first
    attention norm of x: h16 = bf(x·r0) and rstd0 = r0 (the qkv product's rows, as residual_norm
    writes the other layers'); the rotary table rope (T, d) = [cos | sin] of the same rows, which
    the qkv and attention-backward epilogues read; and the next-row links (T,) int32 the
    embedding backward walks (BLOCK_T ≥ T).
    An id outside [0, V) (a u32 ≥ 2^31 reads as negative here) gathers nothing: its row is zero,
    so no read leaves E; cross_entropy flags the row (CE_BAD_ID) and the host ends the run."""
    await_previous_grid(PDL)
    offs_r, offs_d, mask_r, mask, offs = _row_block(T, D, BLOCK_R, BLOCK_D)
    ids = tl.load(ids_ptr + offs_r, mask=mask_r, other=0).to(tl.int32)
    in_table = (ids >= 0) & (ids < V)
    e = tl.load(table_ptr + ids[:, None] * D + offs_d[None, :], mask=mask & in_table[:, None],
                other=0.0)
    r = _rstd(e, D)
    g = tl.load(g_ptr + offs_d, mask=offs_d < D, other=0.0)
    tl.store(emb_ptr + offs, e, mask=mask)
    tl.store(rstd_ptr + offs_r, r, mask=mask_r)
    x = (e * r[:, None]) * g[None, :]
    tl.store(x_ptr + offs, x, mask=mask)
    r0 = _rstd(x, D)
    tl.store(h16_ptr + offs, (x * r0[:, None]).to(tl.bfloat16), mask=mask)
    tl.store(rstd0_ptr + offs_r, r0, mask=mask_r)
    store_rope(rope_ptr, offs_r, T, HEAD_DIM)
    store_next_rows(ids_ptr, next_ptr, offs_r, T, BLOCK_T)


@triton.jit
def residual_norm(x_ptr, part_ptr, g_ptr, out_ptr, h16_ptr, rstd_ptr, T, D: tl.constexpr,
                  PARTS: tl.constexpr, HAS_GAIN: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """out = x + ((part_0 + part_1) + …) (T, D): the residual add of a split-K product — the mlp
    down's PARTS partials (PARTS, T, D), added in split order, then to the residual x (NUMERICS
    mlp) — and the norm that reads it, of BLOCK_R whole rows: h16 = bf(out·r), or bf(out·r·g)
    with HAS_GAIN (NUMERICS final_norm: the head's operand), and rstd = r (T,) for the backward.
    (g_ptr is unread without HAS_GAIN.)"""
    await_previous_grid(PDL)
    offs_r, offs_d, mask_r, mask, offs = _row_block(T, D, BLOCK_R, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0) + load_parts(part_ptr, offs, mask, T * D, PARTS)
    tl.store(out_ptr + offs, x, mask=mask)
    r = _rstd(x, D)
    y = x * r[:, None]
    if HAS_GAIN:
        y = y * tl.load(g_ptr + offs_d, mask=offs_d < D, other=0.0)[None, :]
    tl.store(h16_ptr + offs, y.to(tl.bfloat16), mask=mask)
    tl.store(rstd_ptr + offs_r, r, mask=mask_r)


@triton.jit
def load_parts(ptr, offs, mask, STRIDE, PARTS: tl.constexpr):
    """Σ_s ptr[s·STRIDE + offs] for s = 0 .. PARTS−1, added in s order (split-K partials of a
    product: ((p0 + p1) + p2) + …, a fixed order)."""
    total = tl.load(ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, PARTS):
        total = total + tl.load(ptr + s * STRIDE + offs, mask=mask, other=0.0)
    return total


@triton.jit
def rmsnorm_bwd_rows(pid, dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, T, D: tl.constexpr,
                     HAS_GAIN: tl.constexpr, ACCUMULATE: tl.constexpr, WRITE_BF16: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DY_PARTS: tl.constexpr):
    """Rows pid·BLOCK_R … of dx [+]= r·(dy' − y·mean(dy'·y)), dy' = Σ partials of dy [·g]."""
    offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < T
    mask = mask_r[:, None] & (offs_d[None, :] < D)
    offs = offs_r[:, None] * D + offs_d[None, :]
    dy = load_parts(dy_ptr, offs, mask, T * D, DY_PARTS)
    if HAS_GAIN:
        dy = dy * tl.load(g_ptr + offs_d, mask=offs_d < D, other=0.0)[None, :]
    r = tl.load(rstd_ptr + offs_r, mask=mask_r, other=0.0)
    y = tl.load(x_ptr + offs, mask=mask, other=0.0) * r[:, None]
    mean = tl.div_rn(tl.sum(dy * y, 1), tl.full((), D, tl.float32))
    dx = r[:, None] * (dy - y * mean[:, None])
    if ACCUMULATE:
        dx = tl.load(dx_ptr + offs, mask=mask, other=0.0) + dx
    tl.store(dx_ptr + offs, dx, mask=mask)
    if WRITE_BF16:
        tl.store(dx16_ptr + offs, dx.to(tl.bfloat16), mask=mask)


@triton.jit
def gain_cols(pid, dy_ptr, x_ptr, rstd_ptr, dg_ptr, T, D: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DY_PARTS: tl.constexpr):
    """Columns pid·BLOCK_D … of dg (D,) = Σ_rows dy·y, y = x·r, rows in increasing order."""
    offs_d = pid * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for r0 in range(0, T, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask_r = offs_r < T
        mask = mask_r[:, None] & mask_d[None, :]
        offs = offs_r[:, None] * D + offs_d[None, :]
        r = tl.load(rstd_ptr + offs_r, mask=mask_r, other=0.0)
        y = tl.load(x_ptr + offs, mask=mask, other=0.0) * r[:, None]
        acc += tl.sum(load_parts(dy_ptr, offs, mask, T * D, DY_PARTS) * y, 0)
    tl.store(dg_ptr + offs_d, acc, mask=mask_d)


@triton.jit
def rmsnorm_bwd(dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, T, D: tl.constexpr,
                HAS_GAIN: tl.constexpr, ACCUMULATE: tl.constexpr, WRITE_BF16: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DY_PARTS: tl.constexpr,
                PDL: tl.constexpr = False):
    """dx [+]= r·(dy' − y·mean(dy'·y)), dy' = dy [·g], y = x·r; optionally dx16 = bf(dx).
    dy is (DY_PARTS, T, D): split-K partials, summed in order."""
    await_previous_grid(PDL)
    rmsnorm_bwd_rows(tl.program_id(0), dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, T, D,
                     HAS_GAIN, ACCUMULATE, WRITE_BF16, BLOCK_R, BLOCK_D, DY_PARTS)


@triton.jit
def rmsnorm_bwd_gain(dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, dg_ptr, T, D: tl.constexpr,
                     WRITE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                     GAIN_ROWS: tl.constexpr, GAIN_COLS: tl.constexpr, DY_PARTS: tl.constexpr,
                     PDL: tl.constexpr = False):
    """The gained norms' backward in one launch: the first cdiv(T, BLOCK_R) programs are
    rmsnorm_bwd (HAS_GAIN, no accumulation), the next cdiv(D, GAIN_COLS) the gain gradient
    dg (D,) = Σ_rows dy·y, y = x·r, rows in a fixed order (no atomics).  Both only read dy, x, r;
    neither writes what the other reads."""
    await_previous_grid(PDL)
    pid = tl.program_id(0)
    row_programs = tl.cdiv(T, BLOCK_R)
    if pid < row_programs:
        rmsnorm_bwd_rows(pid, dy_ptr, x_ptr, rstd_ptr, g_ptr, dx_ptr, dx16_ptr, T, D,
                         True, False, WRITE_BF16, BLOCK_R, BLOCK_D, DY_PARTS)
    else:
        gain_cols(pid - row_programs, dy_ptr, x_ptr, rstd_ptr, dg_ptr, T, D, GAIN_ROWS, GAIN_COLS,
                  DY_PARTS)
