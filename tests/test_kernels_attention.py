"""Issue #7: flash attention forward and backward in Triton's interpreter against the reference
stages: grouped heads, causal mask, several block shapes, outputs poisoned, runs repeat bitwise;
the backward's epilogues apply rotary_backward and round to bf16 (the qkv_backward operands).

The kernels have no row masks: T must be a multiple of both blocks (and BLOCK_M of BLOCK_N).
The awkward cases here are the ones they can run (a single block, six heads, BLOCK_M = 4·BLOCK_N);
the launch builder refuses the ones they cannot (test_builder_refuses_blocks_that_do_not_tile_t)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from kernels_support import (ONE_BF16_ULP, assert_bitwise, assert_close, assert_written, bf16_tensor,
                             f32, poisoned)

import torch
from plan import launch_builders, profiles
from plan import reference as ref
from plan.kernels.attention import attention_bwd, attention_fwd
from plan.launch_refs import Context, layer_refs

# Flash attention rounds bf(exp(s − m)) before normalizing (NUMERICS.md): ≤ 1 bf16 ulp of p.
ATTENTION_OUT = ONE_BF16_ULP / 2       # measured worst 1.9e-3 of max|o|
# The backward recomputes p in fp32 from lse and rounds ds and p to bf16 like the reference;
# the remaining differences are lse's last bits and summation order.
ATTENTION_GRAD = 1e-3                    # measured worst 1.4e-4 of max|grad|
# The backward stores bf(rotary_backward(dq')) etc.: the fp32 difference above, then bf16 rounding
# that may go the other way: one bf16 ulp of the largest element, plus ATTENTION_GRAD.
ATTENTION_GRAD16 = ONE_BF16_ULP + ATTENTION_GRAD

CASES = [  # T, H, G, d, BLOCK_M, BLOCK_N
    (192, 4, 2, 32, 64, 32),
    (128, 4, 1, 64, 32, 32),
    (256, 2, 2, 16, 128, 64),
    (32, 2, 1, 16, 32, 32),      # T = one block: a single program per head, the diagonal only
    (128, 6, 3, 32, 64, 16),     # six heads (not a power of 2); BLOCK_M = 4·BLOCK_N
]


def _inputs(rng, T, H, G, d):
    q = rng.standard_normal((T, H * d)).astype(np.float32)
    k = rng.standard_normal((T, G * d)).astype(np.float32)
    v = rng.standard_normal((T, G * d)).astype(np.float32)
    return q, k, v


def _forward(qkv16, T, H, G, d, bm, bn):
    o16, o32, lse = poisoned((T, H * d), torch.bfloat16), poisoned((T, H * d)), poisoned((H, T))
    attention_fwd[(T // bm, H)](qkv16, o16, o32, lse, T, SCALE=float(ref.attention_scale(d)),
                                HEADS=H, KV_HEADS=G, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn)
    for name, t in (("o16", o16), ("o32", o32), ("lse", lse)):
        assert_written(name, t)
    return o16, o32, lse


@pytest.mark.parametrize("T,H,G,d,bm,bn", CASES)
def test_attention_forward_matches_stage(T, H, G, d, bm, bn):
    rng = np.random.default_rng(T + H)
    q, k, v = _inputs(rng, T, H, G, d)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    o16, o32, lse = _forward(qkv16, T, H, G, d, bm, bn)
    want = ref.attention(q, k, v, d)
    assert_close("o", f32(o32), want.o, ATTENTION_OUT)
    assert_close("o16", f32(o16), ref.bf16(f32(o32)), 0.0)
    # lse = log Σ exp(s): check against the scores directly
    s = (ref.bf16(q).reshape(T, H, d).transpose(1, 0, 2)
         @ ref.bf16(k).reshape(T, G, d).transpose(1, 2, 0).repeat(H // G, axis=0))
    s = s.astype(np.float64) * float(ref.attention_scale(d))
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    want_lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert_close("lse", f32(lse), want_lse, 1e-5)


@pytest.mark.parametrize("T,H,G,d,bm,bn", CASES)
def test_attention_backward_matches_stage(T, H, G, d, bm, bn):
    rng = np.random.default_rng(100 + T)
    q, k, v = _inputs(rng, T, H, G, d)
    do = rng.standard_normal((T, H * d)).astype(np.float32)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    _, o32, lse = _forward(qkv16, T, H, G, d, bm, bn)
    # delta = rowsum(do·o) per head (matmul_delta's epilogue forms it; tested with the matmuls)
    delta = torch.from_numpy(np.ascontiguousarray(
        (do * f32(o32)).reshape(T, H, d).sum(-1, dtype=np.float32).T))
    cos, sin = ref.rotary_tables(type("P", (), {"context": T, "head_dim": d})())
    rope = torch.from_numpy(np.concatenate([cos, sin], axis=1))
    W = (H + 2 * G) * d
    consts = dict(SCALE=float(ref.attention_scale(d)), HEADS=H, KV_HEADS=G, HEAD_DIM=d,
                  BLOCK_M=bm, BLOCK_N=bn)
    runs = []
    for _ in range(2):
        dqkv = poisoned((T, W), torch.bfloat16)
        attention_bwd[(T // bn * G + T // bm * H,)](qkv16, torch.from_numpy(do), lse, delta, rope,
                                                     dqkv, T, **consts)
        assert_written("dqkv", dqkv)
        runs.append(dqkv)
    assert_bitwise("attention backward of two identical runs", f32(runs[0]), f32(runs[1]))
    at = ref.attention(q, k, v, d)
    dq, dk, dv = ref.attention_backward(do, q, k, v, f32(o32), at.p, d)
    got = f32(runs[0])
    # NUMERICS rotary_backward, then bf(): what qkv_backward multiplies
    assert_close("bf(dq)", got[:, :H * d], ref.bf16(ref.rotary_backward(dq, cos, sin)),
                 ATTENTION_GRAD16)
    assert_close("bf(dk)", got[:, H * d:(H + G) * d], ref.bf16(ref.rotary_backward(dk, cos, sin)),
                 ATTENTION_GRAD16)
    assert_close("bf(dv)", got[:, (H + G) * d:], ref.bf16(dv), ATTENTION_GRAD16)


@pytest.mark.parametrize("context,blocks", [
    (1000, None),                # tiny's 128×128 blocks: 1000 is no multiple of 128
    (1024, (128, 96)),           # T a multiple of BLOCK_M but not of BLOCK_N
    (1024, (32, 64)),            # BLOCK_M not a multiple of BLOCK_N
])
@pytest.mark.parametrize("which", ["attention_fwd", "attention_bwd"])
def test_builder_refuses_blocks_that_do_not_tile_t(context, blocks, which):
    """A shape the kernels cannot run (they load whole blocks) never becomes a launch."""
    ctx = Context(dataclasses.replace(profiles.get("tiny"), context=context))
    if blocks:
        ctx.tu = dataclasses.replace(ctx.tu, attn_m=blocks[0], attn_n=blocks[1])
    ly = layer_refs(ctx, 0)
    args = (dict(qkv=ly.qkv16, o16=ly.o16, o32=ly.o32, lse=ly.lse) if which == "attention_fwd" else
            dict(qkv=ly.qkv16, do=ctx.buf("do32"), lse=ly.lse, delta=ctx.buf("delta"),
                 rope=ctx.buf("rope"), dqkv=ctx.buf("dqkv16")))
    with pytest.raises(ValueError, match=f"do not tile T={context}"):
        getattr(launch_builders, which)(ctx, label="refused", **args)
