"""Flash attention forward and backward in Triton's interpreter against the reference stages:
grouped heads, causal mask, several block shapes and splits, outputs and scratch poisoned, each
kernel's writes exactly its own, runs repeat bitwise; the backward's epilogues apply
rotary_backward and round to bf16 (the qkv_backward operands).

Both passes run as two launches (plan/attention_split.py): chunk programs writing fp32 partials
(and bf(ds) tiles), then a fixed-order merge.  The chunks here divide the rows unevenly (a ragged
last chunk), split into one trip per program, or not at all.  Splitting changes the order of fp32
sums, so the results are not the unsplit kernels' bits: they stay within the tolerances of
tests/support/tolerances.py (ATTENTION_OUT, ATTENTION_GRAD16).

The kernels have no row masks: T must be a multiple of both blocks (and BLOCK_M of BLOCK_N).
The awkward cases here are the ones they can run (a single block, six heads, BLOCK_M = 4·BLOCK_N,
GQA groups of 1, 2 and 4); the launch builder refuses the ones they cannot
(test_builder_refuses_blocks_that_do_not_tile_t, test_builder_refuses_chunks_the_kernels_cannot_run).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.support.kernels_support import (assert_bitwise, assert_close, assert_unwritten, assert_written,
                             bf16_tensor, f32, poisoned)
from tests.support.tolerances import ATTENTION_GRAD16, ATTENTION_OUT, ELEMENTWISE, EXACT, LSE

import torch
from coppelius.plan.launches import builders as launch_builders
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.attention_split import AttentionSplit
from coppelius.plan.kernels.attention import attention_bwd, attention_bwd_dq, attention_fwd, attention_fwd_merge
from coppelius.plan.launches.refs import Context, grad_refs, layer_refs

CASES = [  # T, H, G, d, BLOCK_M, BLOCK_N, forward chunk (kv blocks), dK/dV chunk (trips)
    (192, 4, 2, 32, 64, 32, 2, 3),     # fwd 1, 2, 3 chunks; dK/dV 6 and 4 trips in 3s (ragged)
    (128, 4, 1, 64, 32, 32, 1, 5),     # GQA group 4; one kv block per forward program; 16..4 by 5
    (256, 2, 2, 16, 128, 64, 2, 1),    # GQA group 1; one trip per dK/dV program
    (32, 2, 1, 16, 32, 32, 1, 1),      # T = one block: a single program per head, the diagonal only
    (128, 6, 3, 32, 64, 16, 4, 3),     # six heads (not a power of 2); BLOCK_M = 4·BLOCK_N
    (192, 4, 2, 32, 64, 32, 8, 64),    # chunks longer than every row: no split at all
]


def _inputs(rng, T, H, G, d):
    q = rng.standard_normal((T, H * d)).astype(np.float32)
    k = rng.standard_normal((T, G * d)).astype(np.float32)
    v = rng.standard_normal((T, G * d)).astype(np.float32)
    return q, k, v


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bits (unwritten scratch is NaN poison, which equals nothing as a float)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()


def _split(T, H, G, bm, bn, fwd_chunk, bwd_chunk) -> AttentionSplit:
    return AttentionSplit(T, bm, bn, H, G, fwd_chunk, bwd_chunk)


def _check_slots(name, part, split: AttentionSplit, used):
    """Slot c of the rows of block b is written iff used(b, c); the rest keeps its poison."""
    rows = part.shape[-1] if part.dim() == 4 else part.shape[1]
    blocks = split.q_blocks if name != "kv_part" else split.kv_blocks
    size = rows // blocks
    for b in range(blocks):
        for c in range(part.shape[0]):
            sl = (part[c, :, :, b * size:(b + 1) * size] if part.dim() == 4
                  else part[c, b * size:(b + 1) * size])
            (assert_written if used(b, c) else assert_unwritten)(f"{name}[{c}] block {b}", sl)


def run_forward(qkv16, T, H, G, d, bm, bn, fwd_chunk):
    """attention_fwd then attention_fwd_merge on poisoned scratch and outputs; checks which
    partial slots the chunks write.  → (o16, o32, lse, o_part, ml_part)"""
    split = _split(T, H, G, bm, bn, fwd_chunk, 1)
    o_part = poisoned((split.fwd_slots, T, H * d))
    ml_part = poisoned((split.fwd_slots, 2, H, T))
    attention_fwd[(len(split.fwd_programs()),)](
        qkv16, o_part, ml_part, T, SCALE=float(ref.attention_scale(d)), HEADS=H, KV_HEADS=G,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, FWD_CHUNK=fwd_chunk)
    used = lambda m, c: c < split.fwd_chunks(m)  # noqa: E731
    _check_slots("o_part", o_part, split, used)
    _check_slots("ml_part", ml_part, split, used)
    o16, o32, lse = poisoned((T, H * d), torch.bfloat16), poisoned((T, H * d)), poisoned((H, T))
    attention_fwd_merge[(len(split.fwd_merge_programs()),)](
        o_part, ml_part, o16, o32, lse, T, HEADS=H, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn,
        FWD_CHUNK=fwd_chunk)
    for name, t in (("o16", o16), ("o32", o32), ("lse", lse)):
        assert_written(name, t)
    return o16, o32, lse, o_part, ml_part


@pytest.mark.parametrize("T,H,G,d,bm,bn,fc,bc", CASES)
def test_attention_forward_matches_stage(T, H, G, d, bm, bn, fc, bc):
    rng = np.random.default_rng(T + H)
    q, k, v = _inputs(rng, T, H, G, d)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    runs = [run_forward(qkv16, T, H, G, d, bm, bn, fc) for _ in range(2)]
    for name, a, b in zip(("o16", "o32", "lse", "o_part", "ml_part"), *runs):
        assert_bitwise(f"forward {name} of two identical runs", _bits(a), _bits(b))
    o16, o32, lse = runs[0][:3]
    want = ref.attention(q, k, v, d)
    assert_close("o", f32(o32), want.o, ATTENTION_OUT)
    assert_close("o16", f32(o16), ref.bf16(f32(o32)), EXACT)
    # lse = log Σ exp(s): check against the scores directly
    s = (ref.bf16(q).reshape(T, H, d).transpose(1, 0, 2)
         @ ref.bf16(k).reshape(T, G, d).transpose(1, 2, 0).repeat(H // G, axis=0))
    s = s.astype(np.float64) * float(ref.attention_scale(d))
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    want_lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert_close("lse", f32(lse), want_lse, LSE)


def _merge_oracle(o_part, ml_part, chunks):
    """numpy fp32 merge in chunk order: M = max m_c, l = Σ l_c e^(m_c−M), acc = Σ acc_c e^(m_c−M);
    o_part (C, R, H·d), ml_part (C, 2, H, R) → o (R, H·d), lse (H, R)."""
    m = ml_part[:chunks, 0]
    M = m.max(0)
    w = np.exp(m - M)                                               # (chunks, H, R)
    d = o_part.shape[2] // M.shape[0]
    l, acc = np.zeros_like(M), np.zeros_like(o_part[0])
    for c in range(chunks):
        l = l + ml_part[c, 1] * w[c]
        acc = acc + o_part[c] * np.repeat(w[c].T, d, axis=1)
    return acc / np.repeat(l.T, d, axis=1), M + np.log(l)


def test_forward_merge_formula():
    """The merge alone on random partials: three query blocks of one kv block each per chunk
    (FWD_CHUNK = 1), so 1, 2 and 3 chunks; 3 heads.  One chunk gives o = acc/l and
    lse = m + log l exactly (e^0 = 1)."""
    T, H, d, bm = 96, 3, 16, 32
    rng = np.random.default_rng(3)
    o_part = rng.standard_normal((3, T, H * d)).astype(np.float32)
    ml_part = np.stack([rng.standard_normal((3, H, T)) * 4,
                        rng.uniform(1, 9, (3, H, T))], 1).astype(np.float32)
    o16, o32, lse = poisoned((T, H * d), torch.bfloat16), poisoned((T, H * d)), poisoned((H, T))
    attention_fwd_merge[(3 * H,)](torch.from_numpy(o_part), torch.from_numpy(ml_part), o16, o32,
                                  lse, T, HEADS=H, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bm, FWD_CHUNK=1)
    for m in range(3):
        rows = slice(m * bm, (m + 1) * bm)
        want_o, want_lse = _merge_oracle(o_part[:, rows], ml_part[..., rows], m + 1)
        assert_close(f"o rows {rows}", f32(o32)[rows], want_o, ELEMENTWISE)
        assert_close(f"lse rows {rows}", f32(lse)[:, rows], want_lse, ELEMENTWISE)
    one = slice(0, bm)
    assert_bitwise("o of one chunk", f32(o32)[one],
                   o_part[0, one] / np.repeat(ml_part[0, 1, :, one].T, d, axis=1))
    assert_bitwise("lse of one chunk", f32(lse)[:, one],
                   ml_part[0, 0, :, one] + np.log(ml_part[0, 1, :, one]))
    assert_close("o16", f32(o16), ref.bf16(f32(o32)), EXACT)


def _causal_tiles(split: AttentionSplit, H: int):
    """(head, kv rows, query rows) slices of ds16 the dK/dV pass owns: every (kv block, query
    block) pair it visits."""
    bm, bn = split.block_m, split.block_n
    for h in range(H):
        for n in range(split.kv_blocks):
            for m in range(split.q_blocks):
                yield (h, slice(n * bn, (n + 1) * bn), slice(m * bm, (m + 1) * bm)), m >= split.first_q(n)


def run_backward(qkv16, do, lse, delta, rope, T, H, G, d, bm, bn, bwd_chunk):
    """attention_bwd then attention_bwd_dq on poisoned scratch and outputs; checks which partial
    slots and ds16 tiles the chunks write.  → (dqkv, kv_part, ds16)"""
    split = _split(T, H, G, bm, bn, 1, bwd_chunk)
    kv_part = poisoned((split.bwd_slots, T, 2 * G * d))
    ds16 = poisoned((H, T, T), torch.bfloat16)
    attention_bwd[(len(split.dkdv_programs()),)](
        qkv16, do, lse, delta, kv_part, ds16, T, SCALE=float(ref.attention_scale(d)), HEADS=H,
        KV_HEADS=G, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, BWD_CHUNK=bwd_chunk)
    _check_slots("kv_part", kv_part, split, lambda n, c: c < split.dkdv_chunks(n))
    for index, owned in _causal_tiles(split, H):
        (assert_written if owned else assert_unwritten)(f"ds16{index}", ds16[index])
    dqkv = poisoned((T, (H + 2 * G) * d), torch.bfloat16)
    attention_bwd_dq[(len(split.dq_programs()),)](
        qkv16, ds16, kv_part, rope, dqkv, T, HEADS=H, KV_HEADS=G, HEAD_DIM=d, BLOCK_M=bm,
        BLOCK_N=bn, BWD_CHUNK=bwd_chunk)
    assert_written("dqkv", dqkv)
    return dqkv, kv_part, ds16


@pytest.mark.parametrize("T,H,G,d,bm,bn,fc,bc", CASES)
def test_attention_backward_matches_stage(T, H, G, d, bm, bn, fc, bc):
    rng = np.random.default_rng(100 + T)
    q, k, v = _inputs(rng, T, H, G, d)
    do = rng.standard_normal((T, H * d)).astype(np.float32)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    _, o32, lse, _, _ = run_forward(qkv16, T, H, G, d, bm, bn, fc)
    # delta = rowsum(do·o) per head (matmul_delta's epilogue forms it; tested with the matmuls)
    delta = torch.from_numpy(np.ascontiguousarray(
        (do * f32(o32)).reshape(T, H, d).sum(-1, dtype=np.float32).T))
    cos, sin = ref.rotary_tables(type("P", (), {"context": T, "head_dim": d})())
    rope = torch.from_numpy(np.concatenate([cos, sin], axis=1))
    runs = [run_backward(qkv16, torch.from_numpy(do), lse, delta, rope, T, H, G, d, bm, bn, bc)
            for _ in range(2)]
    for name, a, b in zip(("dqkv", "kv_part", "ds16"), *runs):
        assert_bitwise(f"backward {name} of two identical runs", _bits(a), _bits(b))
    at = ref.attention(q, k, v, d)
    dq, dk, dv = ref.attention_backward(do, q, k, v, f32(o32), at.p, d)
    got = f32(runs[0][0])
    # NUMERICS rotary_backward, then bf(): what qkv_backward multiplies
    assert_close("bf(dq)", got[:, :H * d], ref.bf16(ref.rotary_backward(dq, cos, sin)),
                 ATTENTION_GRAD16)
    assert_close("bf(dk)", got[:, H * d:(H + G) * d], ref.bf16(ref.rotary_backward(dk, cos, sin)),
                 ATTENTION_GRAD16)
    assert_close("bf(dv)", got[:, (H + G) * d:], ref.bf16(dv), ATTENTION_GRAD16)


def _builder_args(ctx, which):
    ly, g = layer_refs(ctx, 0), grad_refs(ctx)
    return {"attention_fwd": dict(qkv=ly.qkv16, o_part=ctx.buf("attn_o_part"),
                                  ml_part=ctx.buf("attn_ml_part")),
            "attention_fwd_merge": dict(o_part=ctx.buf("attn_o_part"),
                                        ml_part=ctx.buf("attn_ml_part"), o16=ly.o16, o32=ly.o32,
                                        lse=ly.lse),
            "attention_bwd": dict(qkv=ly.qkv16, do=g.do32, lse=ly.lse, delta=g.delta,
                                  kv_part=g.kv_part, ds=g.ds16),
            "attention_bwd_dq": dict(qkv=ly.qkv16, ds=g.ds16, kv_part=g.kv_part,
                                     rope=ctx.buf("rope"), dqkv=ly.dqkv16)}[which]


BUILDERS = ["attention_fwd", "attention_fwd_merge", "attention_bwd", "attention_bwd_dq"]


@pytest.mark.parametrize("context,blocks", [
    (1000, None),                # tiny's 128×128 blocks: 1000 is no multiple of 128
    (1024, (128, 96)),           # T a multiple of BLOCK_M but not of BLOCK_N
    (1024, (32, 64)),            # BLOCK_M not a multiple of BLOCK_N
])
@pytest.mark.parametrize("which", BUILDERS)
def test_builder_refuses_blocks_that_do_not_tile_t(context, blocks, which):
    """A shape the kernels cannot run (they load whole blocks) never becomes a launch."""
    ctx = Context(dataclasses.replace(profiles.get("tiny"), context=context))
    if blocks:
        ctx.tu = dataclasses.replace(ctx.tu, attn_m=blocks[0], attn_n=blocks[1])
    with pytest.raises(ValueError, match=f"do not tile T={context}"):
        getattr(launch_builders, which)(ctx, label="refused", **_builder_args(ctx, which))


@pytest.mark.parametrize("chunks,match", [
    ((0, 8), "must be ≥ 1"),
    ((4, 0), "must be ≥ 1"),
    ((3, 8), "no multiple of BLOCK_M"),     # 3 kv blocks of 64 rows: chunk 1 starts mid-block
])
@pytest.mark.parametrize("which", BUILDERS)
def test_builder_refuses_chunks_the_kernels_cannot_run(chunks, match, which):
    """A forward chunk that starts inside a query block would leave its first rows without a key
    (m = −inf, NaN weights); chunks of zero programs are nonsense."""
    ctx = Context(profiles.get("tiny"))
    ctx.tu = dataclasses.replace(ctx.tu, attn_m=128, attn_n=64, attn_fwd_chunk=chunks[0],
                                 attn_bwd_chunk=chunks[1])
    with pytest.raises(ValueError, match=match):
        getattr(launch_builders, which)(ctx, label="refused", **_builder_args(ctx, which))


@pytest.mark.parametrize("name", ["coppelius", "tiny"])
def test_launch_grids_are_the_split(name):
    """Each attention launch's grid is the program list plan/attention_split.py writes, and the
    partial buffers hold the most chunks any block uses."""
    ctx = Context(profiles.get(name))
    split = launch_builders.attention_split(ctx.p, ctx.tu)
    grids = {w: getattr(launch_builders, w)(ctx, label=w, **_builder_args(ctx, w)).grid[0]
             for w in BUILDERS}
    assert grids == {"attention_fwd": len(split.fwd_programs()),
                     "attention_fwd_merge": split.q_blocks * ctx.p.heads,
                     "attention_bwd": len(split.dkdv_programs()),
                     "attention_bwd_dq": split.q_blocks * ctx.p.heads + split.kv_blocks * ctx.p.kv_heads}
    assert ctx.bufs["attn_o_part"].shape[0] == max(split.fwd_chunks(m) for m in range(split.q_blocks))
    assert ctx.bufs["attn_kv_part"].shape[0] == max(split.dkdv_chunks(n) for n in range(split.kv_blocks))
    assert split.fwd_slots > 1 and split.bwd_slots > 1, f"{name}: the split is not exercised"
    # every (query head, query block ≥ the diagonal's) pair of every kv block once, in order
    for n in range(split.kv_blocks):
        pairs = [p for c in range(split.dkdv_chunks(n)) for p in split.dkdv_chunk_pairs(n, c)]
        assert pairs == [(j, m) for j in range(split.group)
                         for m in range(split.first_q(n), split.q_blocks)]
