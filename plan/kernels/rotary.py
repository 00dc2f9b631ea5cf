"""Rotary embedding (rotate-half) as jit helpers: the cos/sin table and the rotation of a register
tile, used in the qkv matmul's epilogue (forward) and the attention backward's epilogues (INVERSE:
the transpose, rotary_backward) — no launch of its own.

The cos/sin table is computed on the device from the row index, in float64, and rounded once to
fp32 (CONTRACT §3): the model defines it, nothing is read from the host.  embed_fwd (the first launch
of every submission) writes it to the `rope` buffer, (T, d) = [cos | sin] per row; the epilogues
load it.  Computing it in the epilogues instead spilled 1.4–2.3 KB per thread (ptxas -v, sm_90a:
16 float64 sin/cos per thread at 128×64 tiles).
"""
import triton
import triton.language as tl

LN_ROPE_BASE = tl.constexpr(9.210340371976184)   # ln(10000) (coppelius.plan.profiles.ROPE_BASE), float64


@triton.jit
def rope_tables(offs_r, HEAD_DIM: tl.constexpr):
    """cos, sin (R, d/2) fp32 for positions offs_r: angle = pos · 10000^(-2i/d) in float64."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_i = tl.arange(0, HALF)
    expo = offs_i.to(tl.float64) * tl.full((), -2.0 / HEAD_DIM, tl.float64)
    freq = tl.exp(expo * tl.full((), LN_ROPE_BASE, tl.float64))
    angle = offs_r.to(tl.float64)[:, None] * freq[None, :]
    return tl.cos(angle).to(tl.float32), tl.sin(angle).to(tl.float32)


@triton.jit
def store_rope(rope_ptr, offs_r, T, HEAD_DIM: tl.constexpr):
    """rope[r] = [cos | sin] (d,) fp32 for the rows offs_r < T."""
    HALF: tl.constexpr = HEAD_DIM // 2
    c, s = rope_tables(offs_r, HEAD_DIM)
    offs = offs_r[:, None] * HEAD_DIM + tl.arange(0, HALF)[None, :]
    mask = (offs_r < T)[:, None]
    tl.store(rope_ptr + offs, c, mask=mask)
    tl.store(rope_ptr + offs + HALF, s, mask=mask)


@triton.jit
def load_rope(rope_ptr, offs_r, T, HEAD_DIM: tl.constexpr):
    """cos, sin (R, d/2) fp32 of the rows offs_r from the rope buffer (rows ≥ T read as 0)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = offs_r[:, None] * HEAD_DIM + tl.arange(0, HALF)[None, :]
    mask = (offs_r < T)[:, None]
    return (tl.load(rope_ptr + offs, mask=mask, other=0.0),
            tl.load(rope_ptr + offs + HALF, mask=mask, other=0.0))


@triton.jit
def rotate_tile(x, c, s, first_head, ROTATED: tl.constexpr, HEADS: tl.constexpr,
                HEAD_DIM: tl.constexpr, INVERSE: tl.constexpr):
    """x (R, HEADS·d) holding heads first_head .. first_head+HEADS-1 → the same shape rotated;
    heads ≥ ROTATED (the v heads) pass through.  The same fp32 ops as NUMERICS rotary(_backward)."""
    R: tl.constexpr = x.shape[0]
    HALF: tl.constexpr = HEAD_DIM // 2
    # (R, HEADS·d) → (R, HEADS, HALF, 2): the last axis holds the pair (x1[i], x2[i])
    pairs = tl.permute(tl.reshape(x, (R, HEADS, 2, HALF)), (0, 1, 3, 2))
    x1, x2 = tl.split(pairs)                                         # (R, HEADS, HALF)
    c3 = c[:, None, :]
    s3 = s[:, None, :]
    if INVERSE:
        y1 = x1 * c3 + x2 * s3
        y2 = x2 * c3 - x1 * s3
    else:
        y1 = x1 * c3 - x2 * s3
        y2 = x2 * c3 + x1 * s3
    rot = (first_head + tl.arange(0, HEADS) < ROTATED)[None, :, None]
    y1 = tl.where(rot, y1, x1)
    y2 = tl.where(rot, y2, x2)
    return tl.reshape(tl.permute(tl.join(y1, y2), (0, 1, 3, 2)), (R, HEADS * HEAD_DIM))
