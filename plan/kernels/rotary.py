"""Rotary embedding (rotate-half) on the fused qkv rows, fp32 in, bf16 out; INVERSE applies the
transpose (rotary_backward).  The v heads pass through (cast only).

The cos/sin table is computed in the kernel from the row index, in float64, and rounded once to
fp32 (SPEC §3): the model defines it, nothing is read from the host.
"""
import triton
import triton.language as tl

LN_ROPE_BASE = tl.constexpr(9.210340371976184)   # ln(10000) (plan.profiles.ROPE_BASE), float64


@triton.jit
def rotary(src_ptr, dst_ptr, T, ROTATED: tl.constexpr, HEADS: tl.constexpr,
           HEAD_DIM: tl.constexpr, INVERSE: tl.constexpr, BLOCK_R: tl.constexpr):
    """src (T, HEADS·d) fp32 → dst (T, HEADS·d) bf16; heads [0, ROTATED) are rotated."""
    HALF: tl.constexpr = HEAD_DIM // 2
    W: tl.constexpr = HEADS * HEAD_DIM
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_i = tl.arange(0, HALF)
    mask = (offs_r < T)[:, None]
    # angle = pos · 10000^(-2i/d) in float64 → cos/sin → fp32
    expo = offs_i.to(tl.float64) * tl.full((), -2.0 / HEAD_DIM, tl.float64)
    freq = tl.exp(expo * tl.full((), LN_ROPE_BASE, tl.float64))
    angle = offs_r.to(tl.float64)[:, None] * freq[None, :]
    c = tl.cos(angle).to(tl.float32)                                 # (BLOCK_R, HALF)
    s = tl.sin(angle).to(tl.float32)
    base = offs_r[:, None] * W + offs_i[None, :]
    for head in tl.static_range(HEADS):
        x1 = tl.load(src_ptr + base + head * HEAD_DIM, mask=mask, other=0.0)
        x2 = tl.load(src_ptr + base + head * HEAD_DIM + HALF, mask=mask, other=0.0)
        if head < ROTATED:
            if INVERSE:
                y1 = x1 * c + x2 * s
                y2 = x2 * c - x1 * s
            else:
                y1 = x1 * c - x2 * s
                y2 = x2 * c + x1 * s
        else:
            y1 = x1
            y2 = x2
        tl.store(dst_ptr + base + head * HEAD_DIM, y1.to(tl.bfloat16), mask=mask)
        tl.store(dst_ptr + base + head * HEAD_DIM + HALF, y2.to(tl.bfloat16), mask=mask)
