"""Flash attention forward and backward in Triton's interpreter against the reference stages:
grouped heads, causal mask, several block shapes and splits, outputs and scratch poisoned, each
kernel's writes exactly its own, runs repeat bitwise; the backward's epilogues apply
rotary_backward and round to bf16 (the qkv_backward operands).

The forward is one launch (plan/attention_split.py): one program per (query block, head) over its
whole causal range, normalized in its epilogue (o16, o32, lse), its key block its own (shorter
than, equal to or longer than the query block here).  It is checked against three oracles: the
reference stage (softmax, then bf(p)·bf(v): NUMERICS' rounding of p differs by ≤ 1 bf16 ulp), the
same online recurrence in numpy (the kernel's rounding points and order, fp32), and torch's exact
causal attention in float64 on the same bf16 operands (o and lse).
The backward runs as two launches: chunk programs writing fp32 partials (and bf(ds) tiles), then
a fixed-order merge.  Its chunks here divide the rows unevenly (a ragged last chunk), split into
one trip per program, or not at all.  Splitting changes the order of fp32 sums, so the results
are not the unsplit kernels' bits: they stay within the tolerances of tests/support/tolerances.py
(ATTENTION_OUT, ATTENTION_GRAD16).

The kernels have no row masks: T must be a multiple of every block (and BLOCK_M of the
backward's BLOCK_N).  The awkward cases here are the ones they can run (a single block, six heads,
BLOCK_M = 4·BLOCK_N, a forward key block twice the query block, so that whole key blocks past the
rows are masked, GQA groups of 1, 2 and 4); the launch builders refuse the ones they cannot
(test_builder_refuses_blocks_that_do_not_tile_t, test_builder_refuses_chunks_the_kernels_cannot_run).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.support.kernels_support import (assert_bitwise, assert_close, assert_unwritten, assert_written,
                             bf16_tensor, f32, poisoned)
from tests.support.tolerances import (ATTENTION_GRAD16, ATTENTION_OUT, EXACT, LSE, SAME_OPERANDS)

import torch
from coppelius.plan.launches import builders as launch_builders
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.reference import elementary
from coppelius.plan.attention_split import AttentionSplit
from coppelius.plan.ints import cdiv
from coppelius.plan.kernels.attention import attention_bwd, attention_bwd_dq, attention_fwd
from coppelius.plan.launches.refs import Context, grad_refs, layer_refs

CASES = [  # T, H, G, d, BLOCK_M, BLOCK_N (backward), forward key block, dK/dV chunk (trips)
    (192, 4, 2, 32, 64, 32, 32, 3),    # fwd 2, 4, 6 trips; dK/dV 6 and 4 trips in 3s (ragged)
    (128, 4, 1, 64, 32, 32, 64, 5),    # GQA group 4; fwd keys 2·BLOCK_M: even blocks mask 32 keys
    (256, 2, 2, 16, 128, 64, 128, 1),  # GQA group 1; one trip per dK/dV program
    (32, 2, 1, 16, 32, 32, 32, 1),     # T = one block: a single program per head, the diagonal only
    (128, 6, 3, 32, 64, 16, 128, 3),   # six heads (not a power of 2); BLOCK_M = 4·BLOCK_N; one fwd
    #                                    trip per program, block 0's keys 64..127 all masked
    (192, 4, 2, 32, 64, 32, 64, 64),   # dK/dV chunks longer than every row: no split at all
]


def _inputs(rng, T, H, G, d):
    q = rng.standard_normal((T, H * d)).astype(np.float32)
    k = rng.standard_normal((T, G * d)).astype(np.float32)
    v = rng.standard_normal((T, G * d)).astype(np.float32)
    return q, k, v


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bits (unwritten scratch is NaN poison, which equals nothing as a float)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()


def _split(T, H, G, bm, bn, fwd_n, bwd_chunk) -> AttentionSplit:
    return AttentionSplit(T, bm, bn, H, G, fwd_n, bwd_chunk)


def _check_slots(name, part, split: AttentionSplit, used):
    """Slot c of the rows of kv block b is written iff used(b, c); the rest keeps its poison."""
    size = part.shape[1] // split.kv_blocks
    for b in range(split.kv_blocks):
        for c in range(part.shape[0]):
            sl = part[c, b * size:(b + 1) * size]
            (assert_written if used(b, c) else assert_unwritten)(f"{name}[{c}] block {b}", sl)


def run_forward(qkv16, T, H, G, d, bm, fwd_n):
    """attention_fwd on poisoned outputs, one program per (query block, head).
    → (o16, o32, lse)"""
    split = _split(T, H, G, bm, bm, fwd_n, 1)
    o16, o32, lse = poisoned((T, H * d), torch.bfloat16), poisoned((T, H * d)), poisoned((H, T))
    attention_fwd[(len(split.fwd_programs()),)](
        qkv16, o16, o32, lse, T, SCALE=float(ref.attention_scale(d)), HEADS=H, KV_HEADS=G,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=fwd_n)
    for name, t in (("o16", o16), ("o32", o32), ("lse", lse)):
        assert_written(name, t)
    return o16, o32, lse


def _online_oracle(q, k, v, T, H, G, d, bm, fwd_n):
    """The kernel's recurrence in numpy, fp32: per (query block, head) the key blocks in order,
    s = bf(q)·bf(k)ᵀ·scale, running max m, p = exp(s − m), l = l·α + Σ p, acc = acc·α + bf(p)·bf(v);
    then o = acc / l, lse = m + log l.  → o (T, H·d), lse (H, T).  exp and log are the kernel's
    (the project's, as the interpreter evaluates them): p is rounded to bf16, which turns an ulp
    of exp near a bf16 midpoint into 2⁻⁸ of p, far beyond SAME_OPERANDS."""
    scale = ref.attention_scale(d)
    o, lse = np.empty((T, H * d), np.float32), np.empty((H, T), np.float32)
    for h in range(H):
        kv, hd = h // (H // G), slice(h * d, (h + 1) * d)
        kd = slice(kv * d, (kv + 1) * d)
        for m in range(T // bm):
            rows = slice(m * bm, (m + 1) * bm)
            mi = np.full(bm, -np.inf, np.float32)
            li, acc = np.zeros(bm, np.float32), np.zeros((bm, d), np.float32)
            for b in range(cdiv((m + 1) * bm, fwd_n)):
                cols = slice(b * fwd_n, (b + 1) * fwd_n)
                s = (ref.bf16(q[rows, hd]) @ ref.bf16(k[cols, kd]).T) * scale
                s[np.arange(rows.start, rows.stop)[:, None] < np.arange(cols.start, cols.stop)] = -np.inf
                m_new = np.maximum(mi, s.max(1))
                alpha = elementary.exp(mi - m_new)
                p = elementary.exp(s - m_new[:, None])
                li = li * alpha + p.sum(1, dtype=np.float32)
                acc = acc * alpha[:, None] + ref.bf16(p) @ ref.bf16(v[cols, kd])
                mi = m_new
            o[rows, hd] = acc / li[:, None]
            lse[h, rows] = mi + elementary.log(li)
    return o, lse


def _torch_oracle(q, k, v, T, H, G, d):
    """torch's causal attention in float64 on the bf16-rounded q, k, v (exact softmax, p not
    rounded) and the float64 log-sum-exp of the same scores.  → o (T, H·d), lse (H, T)"""
    def heads(x, n):
        return torch.from_numpy(ref.bf16(x).astype(np.float64)).reshape(T, n, d).transpose(0, 1)
    qh = heads(q, H)
    kh, vh = (heads(x, G).repeat_interleave(H // G, dim=0) for x in (k, v))
    scale = float(ref.attention_scale(d))
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    s = (qh @ kh.transpose(1, 2)) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return o.transpose(0, 1).reshape(T, H * d).numpy(), torch.logsumexp(s, -1).numpy()


@pytest.mark.parametrize("T,H,G,d,bm,bn,fn,bc", CASES)
def test_attention_forward_matches_stage(T, H, G, d, bm, bn, fn, bc):
    rng = np.random.default_rng(T + H)
    q, k, v = _inputs(rng, T, H, G, d)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    runs = [run_forward(qkv16, T, H, G, d, bm, fn) for _ in range(2)]
    for name, a, b in zip(("o16", "o32", "lse"), *runs):
        assert_bitwise(f"forward {name} of two identical runs", _bits(a), _bits(b))
    o16, o32, lse = runs[0]
    assert_close("o16", f32(o16), ref.bf16(f32(o32)), EXACT)
    # the reference stage: softmax, then bf(p)·bf(v) (NUMERICS: ≤ 1 bf16 ulp of p apart)
    assert_close("o against the reference stage", f32(o32), ref.attention(q, k, v, d).o, ATTENTION_OUT)
    # the kernel's own recurrence: the same bf16 operands and rounding points, fp32 sums
    want_o, want_lse = _online_oracle(q, k, v, T, H, G, d, bm, fn)
    assert_close("o against the online recurrence", f32(o32), want_o, SAME_OPERANDS)
    assert_close("lse against the online recurrence", f32(lse), want_lse, SAME_OPERANDS)
    # torch, float64, p not rounded: lse = log Σ exp(s) of the same scores
    torch_o, torch_lse = _torch_oracle(q, k, v, T, H, G, d)
    assert_close("o against torch float64", f32(o32), torch_o, ATTENTION_OUT)
    assert_close("lse against torch float64", f32(lse), torch_lse, LSE)


def test_forward_program_order_is_the_split():
    """Program 0 is fwd_programs()[0], the first query block (the shortest rows) of head 0: a
    grid of that one program writes exactly its tile of o16, o32 and lse, with the whole grid's
    bits."""
    T, H, G, d, bm, fn = 128, 3, 1, 16, 32, 64
    split = _split(T, H, G, bm, bm, fn, 1)
    assert split.fwd_programs()[:H] == [(0, h) for h in range(H)]
    assert [split.fwd_trips(m) for m in range(T // bm)] == [1, 1, 2, 2]
    rng = np.random.default_rng(7)
    qkv16 = bf16_tensor(np.concatenate(_inputs(rng, T, H, G, d), axis=1))
    full = run_forward(qkv16, T, H, G, d, bm, fn)
    one = poisoned((T, H * d), torch.bfloat16), poisoned((T, H * d)), poisoned((H, T))
    attention_fwd[(1,)](qkv16, *one, T, SCALE=float(ref.attention_scale(d)), HEADS=H,
                        KV_HEADS=G, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=fn)
    m, h = split.fwd_programs()[0]
    rows, cols = slice(m * bm, (m + 1) * bm), slice(h * d, (h + 1) * d)
    for name, got, want, tile in (("o16", one[0], full[0], (rows, cols)),
                                  ("o32", one[1], full[1], (rows, cols)),
                                  ("lse", one[2], full[2], (h, rows))):
        assert_bitwise(f"program 0's {name}", _bits(got[tile]), _bits(want[tile]))
        got[tile] = float("nan")
        assert_unwritten(f"{name} outside program 0's tile", got)


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
    split = _split(T, H, G, bm, bn, bn, bwd_chunk)
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


@pytest.mark.parametrize("T,H,G,d,bm,bn,fn,bc", CASES)
def test_attention_backward_matches_stage(T, H, G, d, bm, bn, fn, bc):
    rng = np.random.default_rng(100 + T)
    q, k, v = _inputs(rng, T, H, G, d)
    do = rng.standard_normal((T, H * d)).astype(np.float32)
    qkv16 = bf16_tensor(np.concatenate([q, k, v], axis=1))
    _, o32, lse = run_forward(qkv16, T, H, G, d, bm, fn)
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
    return {"attention_fwd": dict(qkv=ly.qkv16, o16=ly.o16, o32=ly.o32, lse=ly.lse),
            "attention_bwd": dict(qkv=ly.qkv16, do=g.do32, lse=ly.lse, delta=g.delta,
                                  kv_part=g.kv_part, ds=g.ds16),
            "attention_bwd_dq": dict(qkv=ly.qkv16, ds=g.ds16, kv_part=g.kv_part,
                                     rope=ctx.buf("rope"), dqkv=ly.dqkv16)}[which]


BUILDERS = ["attention_fwd", "attention_bwd", "attention_bwd_dq"]
UNTILED = {  # each launch's blocks, every one of which must tile T (the kernels load whole blocks)
    "attention_fwd": [(1000, {}),                           # tiny's 128-row blocks: 1000 is not
                      (1024, {"attn_fwd_n": 96}),           # T a multiple of BLOCK_M, not of the keys
                      (1024, {"attn_m": 96}),
                      (1024, {"attn_fwd_n": 0})],
    "attention_bwd": [(1000, {}), (1024, {"attn_n": 96}),
                      (1024, {"attn_m": 32, "attn_n": 64})],  # BLOCK_M not a multiple of BLOCK_N
}
UNTILED["attention_bwd_dq"] = UNTILED["attention_bwd"]


@pytest.mark.parametrize("which,context,blocks", [(w, c, b) for w in BUILDERS for c, b in UNTILED[w]])
def test_builder_refuses_blocks_that_do_not_tile_t(which, context, blocks):
    """A shape the kernels cannot run (they load whole blocks) never becomes a launch."""
    ctx = Context(dataclasses.replace(profiles.get("tiny"), context=context))
    ctx.tu = dataclasses.replace(ctx.tu, **blocks)
    with pytest.raises(ValueError, match=f"do not tile T={context}"):
        getattr(launch_builders, which)(ctx, label="refused", **_builder_args(ctx, which))


@pytest.mark.parametrize("which", ["attention_bwd", "attention_bwd_dq"])
def test_builder_refuses_chunks_the_kernels_cannot_run(which):
    """A dK/dV chunk of no trips is nonsense."""
    ctx = Context(profiles.get("tiny"))
    ctx.tu = dataclasses.replace(ctx.tu, attn_bwd_chunk=0)
    with pytest.raises(ValueError, match="must be ≥ 1"):
        getattr(launch_builders, which)(ctx, label="refused", **_builder_args(ctx, which))


@pytest.mark.parametrize("name", ["coppelius", "tiny"])
def test_launch_grids_are_the_split(name):
    """Each attention launch's grid is the program list plan/attention_split.py writes, the
    forward's key block and stages are its own, no forward partial buffer exists, and the dK/dV
    partial buffer holds the most chunks any block uses."""
    ctx = Context(profiles.get(name))
    split = launch_builders.attention_split(ctx.p, ctx.tu)
    built = {w: getattr(launch_builders, w)(ctx, label=w, **_builder_args(ctx, w)) for w in BUILDERS}
    assert {w: x.grid[0] for w, x in built.items()} == {
        "attention_fwd": split.q_blocks * ctx.p.heads,
        "attention_bwd": len(split.dkdv_programs()),
        "attention_bwd_dq": split.q_blocks * ctx.p.heads + split.kv_blocks * ctx.p.kv_heads}
    fwd = built["attention_fwd"]
    assert dict(fwd.constexprs)["BLOCK_N"] == ctx.tu.attn_fwd_n
    assert fwd.num_stages == ctx.tu.attn_fwd_stages
    assert not any(n.startswith("attn_o_part") or n.startswith("attn_ml_part") for n in ctx.bufs)
    # every (query block, head) once, the shortest causal rows first
    progs = split.fwd_programs()
    assert sorted(progs) == [(m, h) for m in range(split.q_blocks) for h in range(ctx.p.heads)]
    trips = [split.fwd_trips(m) for m, _ in progs]
    assert trips == sorted(trips) and trips[-1] == ctx.p.context // ctx.tu.attn_fwd_n
    assert ctx.bufs["attn_kv_part"].shape[0] == max(split.dkdv_chunks(n) for n in range(split.kv_blocks))
    assert split.bwd_slots > 1, f"{name}: the dK/dV split is not exercised"
    # every (query head, query block ≥ the diagonal's) pair of every kv block once, in order
    for n in range(split.kv_blocks):
        pairs = [p for c in range(split.dkdv_chunks(n)) for p in split.dkdv_chunk_pairs(n, c)]
        assert pairs == [(j, m) for j in range(split.group)
                         for m in range(split.first_q(n), split.q_blocks)]
