"""The matmul kernels in Triton's interpreter against the reference stages, awkward shapes; the
fused prologue (rmsnorm) and epilogues (SwiGLU, rotary, delta) against the stages they replace.

Every test runs over several shape sets (32×32×32 blocks): M = 1, K below one K block, N not a
multiple of the tile; outputs start poisoned, so an element no program wrote fails."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tests.support.kernels_support import (assert_bitwise, assert_close, assert_unwritten, assert_written,
                             bf16_tensor, f32, poisoned, ssq_parts)
from tests.support.tolerances import (DELTA_OF_STORED_DO, ELEMENTWISE, MLP_DH, ONE_BF16_ULP, SAME_OPERANDS,
                        SWIGLU_Z16)

import torch
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.kernels import meta
from coppelius.plan.kernels.matmul import matmul, matmul_delta, matmul_residual, matmul_rotary, matmul_swiglu
from coppelius.plan.kernels.norms import rmsnorm_rows
from coppelius.plan.launches.matmul import matmul_rotary as build_matmul_rotary
from coppelius.plan.launches.refs import Context, layer_refs
from coppelius.plan.ints import cdiv, next_pow2

RNG = np.random.default_rng(7)
BLOCK = 32
BLOCKS = dict(BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK, GROUP_M=2)
# (M, N, K): (rows, output columns, reduction); for the fused kernels N and K are the stage's
# output and input widths (F and D for the MLP, V and D for the head)
SHAPES = {
    "none_a_multiple": (100, 72, 80),      # no dimension a multiple of its block: every mask
    "one_row": (1, 72, 80),                # M = 1: one program row, 31 masked rows
    "k_below_block": (37, 45, 20),         # K < BLOCK_K: one partial K step
    "one_column_over": (64, 33, 96),       # N = one tile + 1 column; M, K whole tiles
}
SHAPE_IDS = list(SHAPES)


def _grid(m, n):
    return (cdiv(m, BLOCK) * cdiv(n, BLOCK),)


def _run(a, b, m, n, k, a_t, b_t, epilogue, aux=None, out_dtype=torch.float32, out_shape=None):
    c = poisoned(out_shape or (m, n), out_dtype)
    aux = c if aux is None else aux
    matmul[_grid(m, n)](a, b, c, aux, m, n, k, A_T=a_t, B_T=b_t, EPILOGUE=epilogue, SPLIT_K=1,
                         **BLOCKS)
    assert_written("c", c)
    return c


@pytest.mark.parametrize("shape", SHAPE_IDS)
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
def test_matmul_layouts_match_bf16_products(layout, shape):
    M, N, K = SHAPES[shape]
    x = RNG.standard_normal((M, K)).astype(np.float32)
    w = RNG.standard_normal((N, K)).astype(np.float32)          # [out, in]
    if layout == "NT":     # h @ Wᵀ (qkv, out_proj, mlp, head)
        want = ref.bf16(x) @ ref.bf16(w).T
        got = _run(bf16_tensor(x), bf16_tensor(w), M, N, K, False, True, meta.EPI_F32)
    elif layout == "NN":   # dY @ W (data gradients): A (M, K), B (K, N)
        wk = np.ascontiguousarray(w.T)
        want = ref.bf16(x) @ ref.bf16(wk)
        got = _run(bf16_tensor(x), bf16_tensor(wk), M, N, K, False, False, meta.EPI_F32)
    else:                  # dYᵀ @ h (weight gradients): A stored (K, M), B (K, N)
        at = np.ascontiguousarray(x.T)
        hk = RNG.standard_normal((K, N)).astype(np.float32)
        want = ref.bf16(at).T @ ref.bf16(hk)
        got = _run(bf16_tensor(at), bf16_tensor(hk), M, N, K, True, False, meta.EPI_F32)
    assert_close(f"matmul {layout}", f32(got), want, SAME_OPERANDS)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_reads_fp32_operands_as_bf16(shape):
    M, N, K = SHAPES[shape]
    x = RNG.standard_normal((M, K)).astype(np.float32)
    w = RNG.standard_normal((N, K)).astype(np.float32)
    got = _run(torch.from_numpy(x), torch.from_numpy(w), M, N, K, False, True, meta.EPI_F32)
    assert_close("fp32 operands", f32(got), ref.bf16(x) @ ref.bf16(w).T, SAME_OPERANDS)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_bf16_epilogue_rounds_to_nearest_even(shape):
    M, N, K = SHAPES[shape]
    x = RNG.standard_normal((M, K)).astype(np.float32)
    w = RNG.standard_normal((N, K)).astype(np.float32)
    got = _run(bf16_tensor(x), bf16_tensor(w), M, N, K, False, True, meta.EPI_BF16,
               out_dtype=torch.bfloat16)
    assert_close("bf16 store", f32(got), ref.bf16(ref.bf16(x) @ ref.bf16(w).T), ONE_BF16_ULP)


def _out_proj_inputs(shape):
    """(M, N, K, x, o, wo) of an out_proj at `shape`: residual x (T, D), attention output o
    (T, H·d), Wo (D, H·d)."""
    M, N, K = SHAPES[shape]
    x = RNG.standard_normal((M, N)).astype(np.float32)
    o = RNG.standard_normal((M, K)).astype(np.float32)
    wo = RNG.standard_normal((N, K)).astype(np.float32) * 0.05
    return M, N, K, x, o, wo


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_residual_epilogue_is_out_proj(shape):
    M, N, K, x, o, wo = _out_proj_inputs(shape)
    got = _run(bf16_tensor(o), bf16_tensor(wo), M, N, K, False, True, meta.EPI_RESIDUAL,
               aux=torch.from_numpy(x))
    assert_close("out_proj", f32(got), ref.out_proj(x, o, wo), SAME_OPERANDS)


SSQ_PARTS = 3                     # the producer's column tiles feeding a norm prologue (any split)


def _ssq(x: np.ndarray, parts: int = SSQ_PARTS) -> torch.Tensor:
    return torch.from_numpy(ssq_parts(x, parts))


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_residual_is_out_proj_and_writes_the_rows_sums_of_squares(shape):
    M, N, K, x, o, wo = _out_proj_inputs(shape)
    out = poisoned((M, N))
    parts = cdiv(N, BLOCK)
    ssq = poisoned((parts + 1, M))                                # a spare row: not written
    matmul_residual[_grid(M, N)](bf16_tensor(o), bf16_tensor(wo), torch.from_numpy(x), out, ssq,
                                 M, N, K, **BLOCKS)
    assert_written("out", out)
    assert_written("ssq", ssq[:parts])
    assert_unwritten("ssq past the column tiles", ssq[parts:])
    want = ref.out_proj(x, o, wo)
    assert_close("out_proj", f32(out), want, SAME_OPERANDS)
    got = f32(out)                                                # the sums are of what it stored
    for c in range(parts):
        cols = got[:, c * BLOCK:(c + 1) * BLOCK]
        assert_close(f"ssq part {c}", f32(ssq[c]), (cols * cols).sum(1), ELEMENTWISE)
    # and their sum is rmsnorm's: the consumer's r
    _, r = ref.rmsnorm(want)
    rr = 1 / np.sqrt(f32(ssq[:parts]).sum(0) / np.float32(N) + np.float32(1e-6))
    assert_close("r from ssq", rr, r, ELEMENTWISE)


def _swiglu_reference(M, D, F):
    x = RNG.standard_normal((M, D)).astype(np.float32)
    wg, wu = (RNG.standard_normal((F, D)).astype(np.float32) * 0.1 for _ in range(2))
    wd = RNG.standard_normal((D, F)).astype(np.float32) * 0.1
    return x, wg, wu, wd, ref.mlp(x, wg, wu, wd)


def _check_norm_rows(h16, rstd, x):
    """The norm a row launch stored: rstd as rmsnorm's r, h16 = bf(x·r) bit for bit from it."""
    assert_written("h16", h16)
    assert_written("rstd", rstd)
    y, r = ref.rmsnorm(x)
    assert_close("rstd", f32(rstd), r, ELEMENTWISE)
    assert_close("h16 vs reference", f32(h16), ref.bf16(y), ONE_BF16_ULP)
    mine = x * f32(rstd)[:, None]                                 # the kernel's own r, same fp32 ops
    assert_bitwise("h16 is bf(x·r) of the stored r", f32(h16), ref.bf16(mine))


NORM_ROWS = 16                  # rows per rmsnorm_rows program


def _norm_rows(x: np.ndarray, ssq: torch.Tensor):
    """rmsnorm_rows on x (M, D) and its partial sums of squares → (h16, rstd), poisoned first."""
    M, D = x.shape
    h16, rstd = poisoned((M, D), torch.bfloat16), poisoned((M,))
    rmsnorm_rows[(cdiv(M, NORM_ROWS),)](torch.from_numpy(x), ssq, h16, rstd, M, D=D,
                                        SSQ_PARTS=ssq.shape[0], BLOCK_R=NORM_ROWS,
                                        BLOCK_D=next_pow2(D))
    return h16, rstd


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_swiglu_on_the_norm_rows_is_the_mlp_stage(shape):
    M, F, D = SHAPES[shape]                           # D = 2.5 K blocks: masked K chunks
    x, wg, wu, wd, m = _swiglu_reference(M, D, F)
    h16, rstd = _norm_rows(x, _ssq(x))
    _check_norm_rows(h16, rstd, x)
    ab = poisoned((M, 2 * F), torch.bfloat16)
    z = poisoned((M, F), torch.bfloat16)
    matmul_swiglu[_grid(M, F)](h16, bf16_tensor(wg), bf16_tensor(wu), ab, z, M, F, D, **BLOCKS)
    assert_written("ab", ab)
    assert_written("z", z)
    hb = f32(h16)                                     # the products of the stored operand
    # NUMERICS mlp: a and b are stored rounded (the fp32 sums' order may move the rounding by
    # one bf16 ulp), and z is formed from exactly the stored values
    a, b = f32(ab)[:, :F], f32(ab)[:, F:]
    assert_close("a", a, ref.bf16(hb @ ref.bf16(wg).T), ONE_BF16_ULP)
    assert_close("b", b, ref.bf16(hb @ ref.bf16(wu).T), ONE_BF16_ULP)
    assert_close("a vs stage", a, m.a, ONE_BF16_ULP)
    with np.errstate(over="ignore"):
        z_of_stored = ref.bf16(a / (np.float32(1) + np.exp(-a)) * b)
    assert_close("z of the stored a, b", f32(z), z_of_stored, ONE_BF16_ULP)
    assert_close("z", f32(z), ref.bf16(m.z), SWIGLU_Z16)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_matmul_swiglu_backward_epilogue(shape):
    M, F, D = SHAPES[shape]
    x, wg, wu, wd, m = _swiglu_reference(M, D, F)
    dx = RNG.standard_normal((M, D)).astype(np.float32)
    ab = bf16_tensor(np.concatenate([m.a, m.b], axis=1))       # bf-rounded already: exact
    got = _run(bf16_tensor(dx), bf16_tensor(wd), M, F, D, False, False, meta.EPI_SWIGLU_BWD,
               aux=ab, out_dtype=torch.bfloat16, out_shape=(M, 2 * F))
    # NUMERICS mlp_backward: dz = bf(dx) @ bf(Wdown); da = dz·b·silu'(a); db = dz·silu(a)
    dz = ref.bf16(dx) @ ref.bf16(wd)
    one = np.float32(1)
    ea = one + np.exp(-m.a)
    sig = one / ea
    da = dz * m.b * (sig * (one + m.a * (one - sig)))
    db = dz * (m.a / ea)
    assert_close("da", f32(got)[:, :F], ref.bf16(da), ONE_BF16_ULP)
    assert_close("db", f32(got)[:, F:], ref.bf16(db), ONE_BF16_ULP)
    # and the dh it feeds equals the reference stage's gradient path
    dh = f32(got) @ ref.bf16(np.concatenate([wg, wu]))
    want = ref.bf16(da) @ ref.bf16(wg) + ref.bf16(db) @ ref.bf16(wu)
    assert_close("dh", dh, want, MLP_DH)


ROTARY_CASES = [  # T, D (= K), H, G, BLOCK_N: d = 32, BLOCK_M = 128
    (1000, 80, 4, 2, 32),        # masked last row block; positions to 999; one head per tile
    (1000, 80, 4, 2, 64),        # two heads per tile
    (1, 80, 4, 2, 64),           # a single row (position 0: no rotation at all)
    (130, 20, 3, 1, 64),         # K < BLOCK_K; N = 160: the last tile half empty (v only)
]


@pytest.mark.parametrize("Tr,Dm,H,G,bn", ROTARY_CASES)
def test_matmul_rotary_is_qkv_then_rotary(Tr, Dm, H, G, bn):
    d = 32
    W = (H + 2 * G) * d
    x = (2 * RNG.standard_normal((Tr, Dm))).astype(np.float32)      # the residual
    w = RNG.standard_normal((W, Dm)).astype(np.float32)  # Wq | Wk | Wv, [out, in]
    cos, sin = ref.rotary_tables(type("P", (), {"context": Tr, "head_dim": d})())
    rope = torch.from_numpy(np.concatenate([cos, sin], axis=1))
    out = poisoned((Tr, W), torch.bfloat16)
    h16 = bf16_tensor(ref.rmsnorm(x)[0])                              # the norm's bf16 rows
    matmul_rotary[(cdiv(Tr, 128) * cdiv(W, bn),)](h16, bf16_tensor(w), out, rope, Tr, W, Dm,
                                                  ROTATED=H + G, HEAD_DIM=d, BLOCK_M=128,
                                                  BLOCK_N=bn, BLOCK_K=32, GROUP_M=2)
    assert_written("qkv16", out)
    # NUMERICS qkv then rotary: q = bf(h) @ bf(Wq)ᵀ (fp32), rotated, then bf() for attention
    qkv = f32(h16) @ ref.bf16(w).T
    q, k, v = qkv[:, :H * d], qkv[:, H * d:(H + G) * d], qkv[:, (H + G) * d:]
    got = f32(out)
    assert_close("q'", got[:, :H * d], ref.bf16(ref.rotary(q, cos, sin)), ONE_BF16_ULP)
    assert_close("k'", got[:, H * d:(H + G) * d], ref.bf16(ref.rotary(k, cos, sin)), ONE_BF16_ULP)
    assert_close("v", got[:, (H + G) * d:], ref.bf16(v), ONE_BF16_ULP)


DELTA_CASES = [  # M, K, H: d = 32, BLOCK_N = 64 (two heads per tile)
    (100, 80, 3),                # N = 96: the last column tile is half empty
    (1, 80, 3),                  # a single row
    (37, 20, 1),                 # K < BLOCK_K; one head in a two-head tile
]


@pytest.mark.parametrize("M,K,H", DELTA_CASES)
def test_matmul_delta_is_out_proj_backward_do_and_delta(M, K, H):
    d = 32
    Hd = H * d
    dx = RNG.standard_normal((M, K)).astype(np.float32)              # dres (T, D)
    wo = RNG.standard_normal((Hd, K)).astype(np.float32)             # Wo [out = D, in = H·d]ᵀ
    o = RNG.standard_normal((M, Hd)).astype(np.float32)
    wk = np.ascontiguousarray(wo.T)                                  # (K = D, N = H·d) as Wo is
    do, delta = poisoned((M, Hd)), poisoned((H + 1, M))              # a spare head row: not written
    matmul_delta[(cdiv(M, 32) * cdiv(Hd, 64),)](
        bf16_tensor(dx), bf16_tensor(wk), do, torch.from_numpy(o), delta, M, Hd, K, HEAD_DIM=d,
        BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=2)
    assert_written("do", do)
    assert_written("delta", delta[:H])
    assert_unwritten("matmul_delta's head past N/d", delta[H:])
    want_do = ref.bf16(dx) @ ref.bf16(wk)
    assert_close("do", f32(do), want_do, SAME_OPERANDS)
    want_delta = (f32(do) * o).reshape(M, H, d).sum(-1).T
    assert_close("delta", f32(delta[:H]), want_delta, DELTA_OF_STORED_DO)


def test_fused_head_tiles_refuse_tiles_that_split_a_head():
    """matmul_rotary and matmul_delta need whole heads per column tile: the builder refuses a
    tuning without one instead of emitting a launch the epilogue would get wrong."""
    ctx = Context(profiles.get("tiny"))                               # d = 32
    ctx.tu = dataclasses.replace(ctx.tu, mm_tiles=((128, 48), (64, 16)))
    ly = layer_refs(ctx, 0)
    with pytest.raises(ValueError, match="whole heads of 32 columns"):
        build_matmul_rotary(ctx, h16=ly.h16_attn, w=ly.wqkv, qkv=ly.qkv16, label="refused")
