"""Issue #7: row kernels (norms, gains, the rotary table, cross-entropy, predictions, embedding backward,
copy) in Triton's interpreter against the reference stages, at awkward sizes, outputs poisoned."""
from __future__ import annotations

import numpy as np
from kernels_support import (ELEMENTWISE, ONE_BF16_ULP, assert_close, assert_written, bf16_tensor,
                             f32, poisoned)

import torch
from plan import reference as ref
from plan.kernels.copy import copy_f32
from plan.kernels.cross_entropy import cross_entropy, predictions
from plan.kernels.embed_grad import embed_grad
from plan.kernels.norms import embed_fwd, rmsnorm_bwd, rmsnorm_bwd_gain

RNG = np.random.default_rng(11)
T, D, V = 77, 96, 300          # awkward: T and V not multiples of their blocks, D not a power of 2
BLOCK_R, BLOCK_D = 16, 128
GRID = (-(-T // BLOCK_R),)
NORM = dict(D=D, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D)
GAIN = dict(GAIN_ROWS=16, GAIN_COLS=32)
GAIN_GRID = (GRID[0] + -(-D // 32),)   # row programs, then column programs of the gain gradient
W1_WORDS = 2000                # crosses from embed_grad's first program (16·96 words) into its second


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _next_rows(ids: np.ndarray) -> np.ndarray:
    """The links embed_grad walks, from their definition: next row with the same id, else T."""
    want = np.full(len(ids), len(ids), np.int32)
    last: dict[int, int] = {}
    for r in range(len(ids) - 1, -1, -1):
        want[r] = last.get(int(ids[r]), len(ids))
        last[int(ids[r])] = r
    return want


def _links(ids: np.ndarray) -> torch.Tensor:
    """next-row links as the plan makes them: by embed_fwd (a throwaway table and gain)."""
    nxt = poisoned((T,), torch.int32)
    embed_fwd[GRID](_t(ids.view(np.int32)), _t(np.ones((V, D), np.float32)), _t(np.ones(D, np.float32)),
                    poisoned((T, D)), poisoned((T,)), poisoned((T, D)), poisoned((T, 32)), nxt, T,
                    HEAD_DIM=32, BLOCK_T=128, **NORM)
    assert_written("next", nxt)
    return nxt


def test_embed_fwd_is_the_embed_stage_and_writes_the_rotary_table_and_links():
    E = RNG.standard_normal((V, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    ids = RNG.integers(0, V, T).astype(np.uint32)
    ids[-1] = V - 1                                              # the last table row
    d = 32
    emb, rstd, x = poisoned((T, D)), poisoned((T,)), poisoned((T, D))
    ids[3] = ids[40] = ids[T - 1]                                # a chain ending at the last row
    rope = poisoned((T + 3, d))                                  # rows past T stay unwritten
    nxt = poisoned((T + 3,), torch.int32)
    embed_fwd[GRID](_t(ids.view(np.int32)), _t(E), _t(g), emb, rstd, x, rope, nxt, T, HEAD_DIM=d,
                    BLOCK_T=128, **NORM)
    for name, t in (("emb", emb), ("rstd", rstd), ("x", x), ("rope", rope[:T]), ("next", nxt[:T])):
        assert_written(name, t)
    assert torch.isnan(rope[T:]).all(), "embed_fwd wrote rope rows past T"
    assert (nxt[T:] == -1).all(), "embed_fwd wrote links past T"
    want_next = _next_rows(ids)
    bad = np.flatnonzero(nxt[:T].numpy() != want_next)
    assert bad.size == 0, f"next-row link of row {bad[:1]}: {nxt[bad[:1]].tolist()} != {want_next[bad[:1]]}"
    want = ref.embed(E, g, ids.astype(np.int64))
    assert_close("e", f32(emb), want.e, 0.0)
    assert_close("r", f32(rstd), want.r, ELEMENTWISE)
    assert_close("x", f32(x), want.x, ELEMENTWISE)
    cos, sin = ref.rotary_tables(type("P", (), {"context": T, "head_dim": d})())
    assert_close("cos", f32(rope[:T, :d // 2]), cos, ELEMENTWISE)
    assert_close("sin", f32(rope[:T, d // 2:]), sin, ELEMENTWISE)


def test_rmsnorm_bwd_variants_match_reference():
    x = (2 * RNG.standard_normal((T, D))).astype(np.float32)
    dy = RNG.standard_normal((T, D)).astype(np.float32)
    dres = RNG.standard_normal((T, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    y, r = ref.rmsnorm(x)
    # final norm: gain, no accumulation, bf16 copy, and the gain gradient beside it
    dx, dx16, dg = poisoned((T, D)), poisoned((T, D), torch.bfloat16), poisoned((D,))
    rmsnorm_bwd_gain[GAIN_GRID](_t(dy), _t(x), _t(r), _t(g), dx, dx16, dg, T, WRITE_BF16=True,
                                **NORM, **GAIN)
    want, want_dg = ref.final_norm_backward(dy, y, r, g)
    for name, t in (("dx", dx), ("dx16", dx16), ("dg", dg)):
        assert_written(name, t)
    assert_close("final_norm_backward", f32(dx), want, ELEMENTWISE)
    assert_close("bf16 copy", f32(dx16), ref.bf16(f32(dx)), 0.0)
    assert_close("final_norm_backward.dg", f32(dg), want_dg, 1e-5)
    # inside a layer: no gain, accumulate into the residual gradient
    acc = _t(dres.copy())
    rmsnorm_bwd[GRID](_t(dy), _t(x), _t(r), _t(g), acc, poisoned((T, D), torch.bfloat16), T,
                      HAS_GAIN=False, ACCUMULATE=True, WRITE_BF16=True, **NORM)
    assert_close("residual + rmsnorm_backward", f32(acc), dres + ref.rmsnorm_backward(dy, y, r),
                 ELEMENTWISE)


def test_gain_grad_is_a_fixed_order_row_sum():
    x = RNG.standard_normal((T, D)).astype(np.float32)
    dy = RNG.standard_normal((T, D)).astype(np.float32)
    y, r = ref.rmsnorm(x)
    ones = _t(np.ones(D, np.float32))

    def run():
        dg = poisoned((D + 3,))                                    # words past D stay unwritten
        rmsnorm_bwd_gain[GAIN_GRID](_t(dy), _t(x), _t(r), ones, poisoned((T, D)), poisoned((1,)), dg,
                                    T, WRITE_BF16=False, **NORM, **GAIN)
        assert torch.isnan(dg[D:]).all(), "rmsnorm_bwd_gain wrote dg past D"
        return dg[:D]

    dg = run()
    assert_written("dg", dg)
    _, want = ref.final_norm_backward(dy, y, r, np.ones(D, np.float32))
    assert_close("dg", f32(dg), want, 1e-5)
    assert torch.equal(dg, run()), "the gain gradient differs between two identical runs"


def test_cross_entropy_writes_ce_twice_and_bf16_dlogits():
    logits = (4 * RNG.standard_normal((T, V))).astype(np.float32)
    targets = RNG.integers(0, V, T).astype(np.uint32)
    targets[0], targets[1] = 0, V - 1
    loss, w0 = poisoned((T,)), poisoned((T,))
    dl = poisoned((T, V), torch.bfloat16)
    cross_entropy[(-(-T // 8),)](_t(logits), _t(targets.view(np.int32)), loss, w0, dl, T, V=V,
                                 ROWS=8, BLOCK_V=512)
    for name, t in (("loss", loss), ("w0", w0), ("dlogits", dl)):
        assert_written(name, t)
    want = ref.cross_entropy(logits, targets.astype(np.int64))
    assert_close("ce", f32(loss), want, ELEMENTWISE)
    assert torch.equal(loss, w0), "w0 must be the same per-row cross-entropy"
    assert_close("dlogits", f32(dl), ref.bf16(ref.cross_entropy_backward(logits, targets)),
                 ONE_BF16_ULP)


def test_predictions_argmax_and_validity():
    logits = RNG.standard_normal((T, V)).astype(np.float32)
    logits[10, 5] = logits[10, 7] = 50.0                         # a tie: the first index wins
    logits[20, 3] = np.nan                                       # invalid row
    logits[20, 4] = 99.0
    pred = poisoned((3, 2), torch.int32)
    predictions[(3,)](_t(logits), pred, V=V, ROW0=10, ROW1=20, ROW2=T - 1, BLOCK_V=512)
    assert_written("predictions", pred)
    assert pred.tolist() == [[5, 1], [4, 0], [int(np.argmax(logits[T - 1])), 1]]


def test_embed_grad_sums_rows_in_order_and_zeroes_absent_ids():
    de = RNG.standard_normal((T, D)).astype(np.float32)
    ids = RNG.integers(0, 40, T).astype(np.uint32)                # many repeats, most ids absent
    ids[5:9] = 7
    nxt = _links(ids)
    dE = poisoned((V, D))
    w1 = poisoned((W1_WORDS + 5,))                                # words past the window stay unwritten
    embed_grad[(-(-V // 16),)](_t(ids.view(np.int32)), nxt, _t(de), dE, w1, T, V, D=D,
                               W1_WORDS=W1_WORDS, BLOCK_V=16, BLOCK_T=128, BLOCK_D=BLOCK_D)
    assert_written("dE", dE)
    want = np.zeros((V, D), np.float32)
    np.add.at(want, ids.astype(np.int64), de)                     # sequential: increasing rows
    assert np.array_equal(f32(dE), want), "dE differs from the in-order row sums (bitwise)"
    assert np.array_equal(f32(w1)[:W1_WORDS], want.reshape(-1)[:W1_WORDS]), \
        "w1 is not dE's first words (bitwise)"
    assert torch.isnan(w1[W1_WORDS:]).all(), "embed_grad wrote w1 past its window"


def test_embed_backward_stage_end_to_end():
    x = RNG.standard_normal((T, D)).astype(np.float32)            # gathered rows e
    dx = RNG.standard_normal((T, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    ids = RNG.integers(0, V, T).astype(np.uint32)
    y, r = ref.rmsnorm(x)
    de, dg = poisoned((T, D)), poisoned((D,))
    rmsnorm_bwd_gain[GAIN_GRID](_t(dx), _t(x), _t(r), _t(g), de, de, dg, T, WRITE_BF16=False,
                                **NORM, **GAIN)
    nxt = _links(ids)
    dE = poisoned((V, D))
    embed_grad[(-(-V // 16),)](_t(ids.view(np.int32)), nxt, de, dE, poisoned((W1_WORDS,)), T, V,
                               D=D, W1_WORDS=W1_WORDS, BLOCK_V=16, BLOCK_T=128, BLOCK_D=BLOCK_D)
    want, want_dg = ref.embed_backward(dx, y, r, g, ids.astype(np.int64), V)
    assert_close("dE", f32(dE), want, ELEMENTWISE)
    assert_close("embed_backward.dg", f32(dg), want_dg, 1e-5)


def test_copy_f32_exact_and_bounded():
    src = RNG.standard_normal(3000).astype(np.float32)
    dst = poisoned((3100,))
    copy_f32[(3,)](_t(src), dst, 2500, BLOCK=1024)
    assert np.array_equal(f32(dst)[:2500], src[:2500])
    assert torch.isnan(dst[2500:]).all(), "copy wrote past N"
