"""Row kernels (norms, gains, the rotary table, cross-entropy, predictions, embedding backward,
copy) in Triton's interpreter against the reference stages, at awkward sizes, outputs poisoned.

Every test runs over several (T, D, V) shape sets: a single row, D below one gain column block,
T and V not multiples of their blocks, D a power of two; blocks derive from the shape as the
launch builders derive them (BLOCK_D, BLOCK_T, BLOCK_V ≥ the dimension they cover)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from tests.support.adamw_oracle import adamw_planes
from tests.support.kernels_support import (assert_bitwise, assert_close, assert_unwritten, assert_written, f32,
                             poisoned)
from tests.support.tolerances import ELEMENTWISE, EXACT, GAIN_SUM, ONE_BF16_ULP

import torch
from coppelius.plan.launches import builders as launch_builders
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.kernels.copy import copy_f32
from coppelius.plan.kernels.cross_entropy import cross_entropy, predictions
from coppelius.plan.kernels.embed_grad import embed_decay, embed_grad
from coppelius.plan.kernels.norms import embed_fwd, residual_norm, rmsnorm_bwd, rmsnorm_bwd_gain
from coppelius.plan.ints import cdiv, next_pow2
from coppelius.staging import layout as L

RNG = np.random.default_rng(11)
BLOCK_R = 16                   # rows per norm program
GAIN = dict(GAIN_ROWS=16, GAIN_COLS=32)
VOCAB_BLOCK = 16               # embed_grad vocabulary rows per program
CE_ROWS = 8
HEAD_DIM = 32                  # the rotary table embed_fwd writes
PROFILE = profiles.get("tiny")  # the learner's constants
LEARNER = launch_builders.learner_constexprs(PROFILE)
T_BASE, DOORBELL = 41, 3       # t = 44
GAP = 13                       # P-plane words between E and the gains


@dataclass(frozen=True)
class Rows:
    T: int
    D: int
    V: int

    @property
    def grid(self):
        return (cdiv(self.T, BLOCK_R),)

    @property
    def gain_grid(self):       # row programs, then column programs of the gain gradient
        return (self.grid[0] + cdiv(self.D, GAIN["GAIN_COLS"]),)

    @property
    def norm(self):
        return dict(D=self.D, BLOCK_R=BLOCK_R, BLOCK_D=next_pow2(self.D))

    @property
    def block_t(self):
        return max(next_pow2(self.T), 16)

    @property
    def w1_words(self):
        # the w1 window: 2000 crosses from embed_grad's first program (16·D words) into its
        # second at D = 96; never more than dE holds
        return min(2000, self.V * self.D - 5)


SHAPES = {
    "awkward": Rows(77, 96, 300),        # T and V not multiples of their blocks, D not a power of 2
    "one_row": Rows(1, 96, 300),         # a single row: one program, 15 masked rows
    "narrow": Rows(16, 20, 17),          # T one whole row block; D < GAIN_COLS; V one block + 1
    "pow2_width": Rows(33, 128, 64),     # D = BLOCK_D exactly; V whole vocabulary blocks
}
SHAPE_IDS = list(SHAPES)


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


def _links(s: Rows, ids: np.ndarray) -> torch.Tensor:
    """next-row links as the plan makes them: by embed_fwd (a throwaway table and gain)."""
    nxt = poisoned((s.T,), torch.int32)
    embed_fwd[s.grid](_t(ids.view(np.int32)), _t(np.ones((s.V, s.D), np.float32)),
                      _t(np.ones(s.D, np.float32)), poisoned((s.T, s.D)), poisoned((s.T,)),
                      poisoned((s.T, s.D)), poisoned((s.T, s.D), torch.bfloat16),
                      poisoned((s.T,)), poisoned((s.T, HEAD_DIM)), nxt, s.T, V=s.V,
                      HEAD_DIM=HEAD_DIM, BLOCK_T=s.block_t, **s.norm)
    assert_written("next", nxt)
    return nxt


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_embed_fwd_is_the_embed_stage_and_writes_the_rotary_table_and_links(shape):
    s = SHAPES[shape]
    T, D, V = s.T, s.D, s.V
    E = RNG.standard_normal((V, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    ids = RNG.integers(0, V, T).astype(np.uint32)
    ids[-1] = V - 1                                              # the last table row
    d = HEAD_DIM
    emb, rstd, x = poisoned((T, D)), poisoned((T,)), poisoned((T, D))
    ids[[r for r in (3, 40) if r < T]] = ids[T - 1]             # a chain ending at the last row
    rope = poisoned((T + 3, d))                                  # rows past T stay unwritten
    nxt = poisoned((T + 3,), torch.int32)
    h16, rstd0 = poisoned((T + 3, D), torch.bfloat16), poisoned((T + 3,))   # rows past T unwritten
    embed_fwd[s.grid](_t(ids.view(np.int32)), _t(E), _t(g), emb, rstd, x, h16, rstd0, rope, nxt,
                      T, V=V, HEAD_DIM=d, BLOCK_T=s.block_t, **s.norm)
    for name, t in (("emb", emb), ("rstd", rstd), ("x", x), ("rope", rope[:T]), ("next", nxt[:T]),
                    ("h16", h16[:T]), ("rstd0", rstd0[:T])):
        assert_written(name, t)
    assert_unwritten("embed_fwd's h16 rows past T", h16[T:])
    assert_unwritten("embed_fwd's rstd0 past T", rstd0[T:])
    # the first attention norm of the x it stored: r0 as rmsnorm's, h16 = bf(x·r0) from it
    got_x = f32(x)
    _, r0 = ref.rmsnorm(got_x)
    assert_close("rstd0", f32(rstd0[:T]), r0, ELEMENTWISE)
    assert_bitwise("h16 is bf(x·r0) of the stored r0", f32(h16[:T]),
                   ref.bf16(got_x * f32(rstd0[:T])[:, None]))
    assert_unwritten("embed_fwd's rope rows past T", rope[T:])
    assert_unwritten("embed_fwd's links past T", nxt[T:])
    assert_bitwise("next-row links", nxt[:T].numpy(), _next_rows(ids))
    want = ref.embed(E, g, ids.astype(np.int64))
    assert_close("e", f32(emb), want.e, EXACT)
    assert_close("r", f32(rstd), want.r, ELEMENTWISE)
    assert_close("x", f32(x), want.x, ELEMENTWISE)
    cos, sin = ref.rotary_tables(type("P", (), {"context": T, "head_dim": d})())
    assert_close("cos", f32(rope[:T, :d // 2]), cos, ELEMENTWISE)
    assert_close("sin", f32(rope[:T, d // 2:]), sin, ELEMENTWISE)


@pytest.mark.parametrize("parts,gain", [(1, False), (3, False), (4, True)])
@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_residual_norm_adds_the_partials_in_order_then_norms(shape, parts, gain):
    """out = x + ((p0 + p1) + p2) bit for bit (the mlp down's split-K partials in split order,
    then the residual add), and the norm of out written once: h16 = bf(out·r) — bf(out·r·g), the
    head's operand, with the gain (NUMERICS final_norm) — and r."""
    s = SHAPES[shape]
    T, D = s.T, s.D
    x = (3 * RNG.standard_normal((T, D))).astype(np.float32)
    part = RNG.standard_normal((parts, T, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    out, h16, rstd = (poisoned((T + 3, D)), poisoned((T + 3, D), torch.bfloat16),
                      poisoned((T + 3,)))                          # rows past T unwritten
    residual_norm[s.grid](_t(x), _t(part), _t(g), out, h16, rstd, T, PARTS=parts,
                          HAS_GAIN=gain, **s.norm)
    for name, t in (("out", out), ("h16", h16), ("rstd", rstd)):
        assert_written(name, t[:T])
        assert_unwritten(f"residual_norm's {name} past T", t[T:])
    total = part[0]
    for k in range(1, parts):
        total = total + part[k]                                   # split order, fp32
    want = x + total
    assert_bitwise("out = x + Σ partials in split order", f32(out[:T]), want)
    y, r = ref.rmsnorm(want)
    assert_close("rstd", f32(rstd[:T]), r, ELEMENTWISE)
    hf = ref.final_norm(want, g).hf if gain else y
    assert_close("h16", f32(h16[:T]), ref.bf16(hf), ONE_BF16_ULP)
    mine = want * f32(rstd[:T])[:, None]                          # its own r, the same fp32 ops
    assert_bitwise("h16 is bf(out·r[·g]) of the stored r", f32(h16[:T]),
                   ref.bf16(mine * g if gain else mine))


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_rmsnorm_bwd_variants_match_reference(shape):
    s = SHAPES[shape]
    T, D = s.T, s.D
    x = (2 * RNG.standard_normal((T, D))).astype(np.float32)
    dy = RNG.standard_normal((T, D)).astype(np.float32)
    dres = RNG.standard_normal((T, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    y, r = ref.rmsnorm(x)
    # final norm: gain, no accumulation, bf16 copy, and the gain gradient beside it
    dx, dx16, dg = poisoned((T, D)), poisoned((T, D), torch.bfloat16), poisoned((D,))
    rmsnorm_bwd_gain[s.gain_grid](_t(dy), _t(x), _t(r), _t(g), dx, dx16, dg, T, WRITE_BF16=True,
                                  DY_PARTS=1, **s.norm, **GAIN)
    want, want_dg = ref.final_norm_backward(dy, y, r, g)
    for name, t in (("dx", dx), ("dx16", dx16), ("dg", dg)):
        assert_written(name, t)
    assert_close("final_norm_backward", f32(dx), want, ELEMENTWISE)
    assert_close("bf16 copy", f32(dx16), ref.bf16(f32(dx)), EXACT)
    assert_close("final_norm_backward.dg", f32(dg), want_dg, GAIN_SUM)
    # inside a layer: no gain, accumulate into the residual gradient; dy as three split-K
    # partials, added in order
    acc = _t(dres.copy())
    parts = np.stack([dy, RNG.standard_normal((T, D)).astype(np.float32), -dy])
    rmsnorm_bwd[s.grid](_t(parts), _t(x), _t(r), _t(g), acc, poisoned((T, D), torch.bfloat16), T,
                        HAS_GAIN=False, ACCUMULATE=True, WRITE_BF16=True, DY_PARTS=3, **s.norm)
    dy3 = (parts[0] + parts[1]) + parts[2]
    assert_close("residual + rmsnorm_backward", f32(acc), dres + ref.rmsnorm_backward(dy3, y, r),
                 ELEMENTWISE)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_gain_grad_is_a_fixed_order_row_sum(shape):
    s = SHAPES[shape]
    T, D = s.T, s.D
    x = RNG.standard_normal((T, D)).astype(np.float32)
    dy = RNG.standard_normal((T, D)).astype(np.float32)
    y, r = ref.rmsnorm(x)
    ones = _t(np.ones(D, np.float32))

    def run():
        dg = poisoned((D + 3,))                                    # words past D stay unwritten
        rmsnorm_bwd_gain[s.gain_grid](_t(dy), _t(x), _t(r), ones, poisoned((T, D)), poisoned((1,)),
                                      dg, T, WRITE_BF16=False, DY_PARTS=1, **s.norm, **GAIN)
        assert_unwritten("rmsnorm_bwd_gain's dg past D", dg[D:])
        return dg[:D]

    dg = run()
    assert_written("dg", dg)
    _, want = ref.final_norm_backward(dy, y, r, np.ones(D, np.float32))
    assert_close("dg", f32(dg), want, GAIN_SUM)
    assert_bitwise("the gain gradient of two identical runs", f32(dg), f32(run()))


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_cross_entropy_writes_ce_twice_and_bf16_dlogits(shape):
    s = SHAPES[shape]
    T, V = s.T, s.V
    logits = (4 * RNG.standard_normal((T, V))).astype(np.float32)
    targets = RNG.integers(0, V, T).astype(np.uint32)
    targets[0], targets[-1] = 0, V - 1                           # the first and the last class

    inputs = RNG.integers(0, V, T).astype(np.uint32)
    inputs[0] = V - 1

    def run(inv_t):
        loss, w0 = poisoned((T,)), poisoned((T,))
        dl = poisoned((T, V), torch.bfloat16)
        cross_entropy[(cdiv(T, CE_ROWS),)](_t(logits), _t(inputs.view(np.int32)),
                                           _t(targets.view(np.int32)), loss, w0, dl, T,
                                           V=V, ROWS=CE_ROWS, BLOCK_V=next_pow2(V), INV_T=inv_t,
                                           CE_BAD_ID=L.LOSS_BAD_ID)
        for name, t in (("loss", loss), ("w0", w0), ("dlogits", dl)):
            assert_written(name, t)
        return loss, w0, dl

    inv_t = launch_builders.inverse_power_of_two(T)
    loss, w0, dl = run(inv_t)
    want = ref.cross_entropy(logits, targets.astype(np.int64))
    assert_close("ce", f32(loss), want, ELEMENTWISE)
    assert_bitwise("w0 is the same per-row cross-entropy", f32(w0), f32(loss))
    assert_close("dlogits", f32(dl), ref.bf16(ref.cross_entropy_backward(logits, targets)),
                 ONE_BF16_ULP)
    if inv_t:                                 # T a power of two: the product is the quotient
        assert_bitwise("dlogits, × 1/T vs ÷ T", f32(dl), f32(run(0.0)[2]))


# ids a fault could put past the host's check: V itself, the u32 maximum (negative as int32),
# 2^31 (the sign bit alone) and a large positive one
BAD_IDS = (None, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_embed_fwd_gathers_nothing_for_an_id_outside_the_table(shape):
    """E sits inside a poisoned allocation (NaN before and after it): an id ≥ V reads no byte of
    it — the row is zero, as are its x and h16 — and the other rows are those of valid ids."""
    s = SHAPES[shape]
    T, D, V = s.T, s.D, s.V
    E = RNG.standard_normal((V, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    ids = RNG.integers(0, V, T).astype(np.uint32)
    rows = sorted({r for r in (0, 5, T // 2, T - 1) if r < T})      # distinct: one row at T = 1
    for r, bad in zip(rows, BAD_IDS):
        ids[r] = V if bad is None else bad
    guard = V * D                                   # words of poison on each side of E
    space = poisoned((3 * V * D,))
    space[guard:guard + V * D] = torch.from_numpy(E.ravel())
    table = space[guard:guard + V * D]
    emb, rstd, x = poisoned((T, D)), poisoned((T,)), poisoned((T, D))
    h16, rstd0 = poisoned((T, D), torch.bfloat16), poisoned((T,))
    embed_fwd[s.grid](_t(ids.view(np.int32)), table, _t(g), emb, rstd, x, h16, rstd0,
                      poisoned((T, HEAD_DIM)), poisoned((T,), torch.int32), T, V=V,
                      HEAD_DIM=HEAD_DIM, BLOCK_T=s.block_t, **s.norm)
    for name, t in (("emb", emb), ("x", x), ("h16", h16)):
        assert_bitwise(f"{name} of the rows with an id outside [0, V)", f32(t[rows]),
                       np.zeros((len(rows), D), np.float32))
    good = np.setdiff1d(np.arange(T), rows)
    assert_bitwise("emb of the valid rows", f32(emb)[good], E[ids[good].astype(np.int64)])


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_cross_entropy_marks_a_row_whose_input_or_target_is_outside_the_vocabulary(shape):
    """The loss record and w0 hold LOSS_BAD_ID exactly at the rows with an input or a target
    outside [0, V) (the host names the first); every other row's ce is the reference's."""
    s = SHAPES[shape]
    T, V = s.T, s.V
    logits = (4 * RNG.standard_normal((T, V))).astype(np.float32)
    inputs = RNG.integers(0, V, T).astype(np.uint32)
    targets = RNG.integers(0, V, T).astype(np.uint32)
    inputs[T - 1], targets[0] = V, 0xFFFFFFFF                   # one row at T = 1: both
    inputs[T // 2] = targets[T // 2] = 0x80000000
    bad = np.zeros(T, bool)
    bad[[0, T // 2, T - 1]] = True
    loss, w0 = poisoned((T,)), poisoned((T,))
    cross_entropy[(cdiv(T, CE_ROWS),)](_t(logits), _t(inputs.view(np.int32)),
                                       _t(targets.view(np.int32)), loss, w0,
                                       poisoned((T, V), torch.bfloat16), T, V=V, ROWS=CE_ROWS,
                                       BLOCK_V=next_pow2(V), INV_T=0.0, CE_BAD_ID=L.LOSS_BAD_ID)
    assert_bitwise("the marked rows", f32(loss)[bad], np.full(bad.sum(), L.LOSS_BAD_ID, np.float32))
    assert_bitwise("w0 is the loss record", f32(w0), f32(loss))
    if (~bad).any():                          # at T = 1 the one row is marked
        want = ref.cross_entropy(logits[~bad], targets[~bad].astype(np.int64))
        assert_close("ce of the valid rows", f32(loss)[~bad], want, ELEMENTWISE)


def test_a_power_of_two_inverse_multiplies_as_the_division_rounds():
    """x · 2^−k and x / 2^k are the same correctly rounded number, subnormal results included,
    for the fp32 values cross_entropy scales (softmax − onehot ∈ [−1, 1])."""
    x = np.concatenate([RNG.uniform(-1, 1, 100_000), RNG.uniform(-1e-35, 1e-35, 100_000),
                        [0.0, -0.0, 1.0, -1.0, np.finfo(np.float32).tiny]]).astype(np.float32)
    for n in (1, 16, 1024, 2 ** 20):
        inv = np.float32(launch_builders.inverse_power_of_two(n))
        assert inv == np.float32(1.0) / np.float32(n)
        assert_bitwise(f"x × 1/{n} vs x / {n}", x * inv, x / np.float32(n))
    assert [launch_builders.inverse_power_of_two(n) for n in (0, 3, 77, 1000)] == [0.0] * 4


@pytest.mark.parametrize("shape", [k for k in SHAPE_IDS if SHAPES[k].T >= 3])   # three rows
def test_predictions_argmax_and_validity(shape):
    s = SHAPES[shape]
    T, V = s.T, s.V
    tie, invalid = (10, 20) if T > 20 else (0, 1)
    logits = RNG.standard_normal((T, V)).astype(np.float32)
    logits[tie, 5] = logits[tie, 7] = 50.0                       # a tie: the first index wins
    logits[invalid, 3] = np.nan                                  # invalid row
    logits[invalid, 4] = 99.0
    pred = poisoned((3, 2), torch.int32)
    predictions[(3,)](_t(logits), pred, V=V, ROW0=tie, ROW1=invalid, ROW2=T - 1,
                      BLOCK_V=next_pow2(V))
    assert_written("predictions", pred)
    assert pred.tolist() == [[5, 1], [4, 0], [int(np.argmax(logits[T - 1])), 1]]


DECAY_PROGRAMS = 3             # embed_decay programs: fewer than the vocabulary blocks (a loop)


def _embed_grad(s: Rows, ids, nxt, de, dgain, w1_words: int, kernels=("decay", "grad")):
    """Run embed_decay (E's absent rows) and embed_grad (the present rows, the gains) in the
    order `kernels` names them (the update's: decay first) on fresh P/M/V planes: E (V, D) at 0,
    then the gains at GAP words after it and after each other → (planes before, planes after,
    w1, gain offsets)."""
    V, D = s.V, s.D
    n = V * D + 3 * GAP + 2 * D
    before = [(0.02 * RNG.standard_normal(n)).astype(np.float32),
              (1e-3 * RNG.standard_normal(n)).astype(np.float32),
              np.abs(1e-6 * RNG.standard_normal(n)).astype(np.float32)]
    pmv = _t(np.concatenate(before))
    g0, g1 = V * D + GAP, V * D + 2 * GAP + D
    w1 = poisoned((w1_words + 5,))                                # words past the window: unwritten
    ids_t, bell = _t(ids.view(np.int32)), torch.tensor([DOORBELL], dtype=torch.int32)
    blocks = dict(D=D, W1_WORDS=w1_words, BLOCK_V=VOCAB_BLOCK, BLOCK_T=s.block_t,
                  BLOCK_D=next_pow2(D), **LEARNER)
    for k in kernels:
        if k == "decay":
            embed_decay[(min(DECAY_PROGRAMS, cdiv(V, VOCAB_BLOCK)),)](
                ids_t, pmv, w1, bell, T_BASE, s.T, V, n, **blocks)
        else:
            embed_grad[(cdiv(V, VOCAB_BLOCK) + 1,)](
                ids_t, nxt, de, pmv, pmv[g0:], pmv[g1:], _t(dgain), w1, bell, T_BASE, s.T, V, n,
                **blocks)
    got = f32(pmv)
    return before, [got[:n], got[n:2 * n], got[2 * n:]], w1, (g0, g1)


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_embed_grad_sums_rows_in_order_and_applies_adamw(shape):
    s = SHAPES[shape]
    T, D, V = s.T, s.D, s.V
    de = RNG.standard_normal((T, D)).astype(np.float32)
    ids = RNG.integers(0, min(40, V), T).astype(np.uint32)       # many repeats, most ids absent
    ids[5:9] = 7
    nxt = _links(s, ids)
    dgain = RNG.standard_normal((2, D)).astype(np.float32)
    before, after, w1, (g0, g1) = _embed_grad(s, ids, nxt, _t(de), dgain, s.w1_words)
    want = np.zeros((V, D), np.float32)
    np.add.at(want, ids.astype(np.int64), de)                     # sequential: increasing rows
    assert_bitwise("w1 vs the in-order row sums", f32(w1)[:s.w1_words],
                   want.reshape(-1)[:s.w1_words])
    assert_unwritten("embed_grad's w1 past its window", w1[s.w1_words:])
    # E: the whole-plane adamw on the in-order sums (absent ids: g = 0, decay and moment decay)
    E = slice(0, V * D)
    oracle = adamw_planes(PROFILE, want, *(b[E] for b in before), T_BASE, DOORBELL)
    for name, got, wnt in zip("PMV", after, oracle):
        assert_bitwise(f"E's {name} vs the whole-plane adamw on dE", got[E], wnt)
    for i, off in enumerate((g0, g1)):                            # the gains: not decayed
        sl = slice(off, off + D)
        oracle = adamw_planes(PROFILE, dgain[i], *(b[sl] for b in before), T_BASE, DOORBELL,
                              decayed=False)
        for name, got, wnt in zip("PMV", after, oracle):
            assert_bitwise(f"gain {i} {name} vs the whole-plane adamw", got[sl], wnt)
    rest = np.ones(before[0].size, bool)
    rest[E] = rest[g0:g0 + D] = rest[g1:g1 + D] = False
    for name, b, a in zip("PMV", before, after):
        assert_bitwise(f"{name} outside E and the gains", a[rest], b[rest])


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_embed_decay_and_embed_grad_divide_e_by_the_ids(shape):
    """embed_decay updates exactly E's absent rows (g = 0) and their w1 words, embed_grad exactly
    the present ones; each leaves the other's rows bit for bit as they were (so the update may
    run them in either order, or at once), and both orders give the same bits."""
    s = SHAPES[shape]
    T, D, V = s.T, s.D, s.V
    de = RNG.standard_normal((T, D)).astype(np.float32)
    ids = RNG.integers(0, min(40, V), T).astype(np.uint32)
    ids[-1] = V - 1                                               # the last row of E present
    nxt = _links(s, ids)
    dgain = RNG.standard_normal((2, D)).astype(np.float32)
    present = np.zeros(V, bool)
    present[ids] = True
    E = slice(0, V * D)
    rows = lambda b: b[E].reshape(V, D)                           # noqa: E731
    words = np.repeat(present, D)[:s.w1_words]                    # w1 words of present rows
    state = RNG.bit_generator.state
    for only, mine in (("decay", ~present), ("grad", present)):
        RNG.bit_generator.state = state                           # the same planes each time
        before, after, w1, _ = _embed_grad(s, ids, nxt, _t(de), dgain, s.w1_words, (only,))
        for name, b, a in zip("PMV", before, after):
            assert_bitwise(f"{only}: E's {name} rows it does not own", rows(a)[~mine], rows(b)[~mine])
            assert (rows(a)[mine] != rows(b)[mine]).any(), f"{only} left its own {name} rows alone"
        own = words if only == "grad" else ~words
        own = torch.from_numpy(own)
        assert_unwritten(f"{only}: w1 words of the other kernel's rows", w1[:s.w1_words][~own])
        assert_written(f"{only}: w1 words of its rows", w1[:s.w1_words][own])
    runs = []
    for order in (("decay", "grad"), ("grad", "decay")):
        RNG.bit_generator.state = state
        runs.append(_embed_grad(s, ids, nxt, _t(de), dgain, s.w1_words, order))
    for name, a, b in zip("PMV", runs[0][1], runs[1][1]):
        assert_bitwise(f"{name}, decay first vs grad first", a, b)
    assert_bitwise("w1, decay first vs grad first", f32(runs[0][2])[:s.w1_words],
                   f32(runs[1][2])[:s.w1_words])


@pytest.mark.parametrize("shape", SHAPE_IDS)
def test_embed_backward_stage_end_to_end(shape):
    s = SHAPES[shape]
    T, D, V = s.T, s.D, s.V
    x = RNG.standard_normal((T, D)).astype(np.float32)            # gathered rows e
    dx = RNG.standard_normal((T, D)).astype(np.float32)
    g = (1 + 0.1 * RNG.standard_normal(D)).astype(np.float32)
    ids = RNG.integers(0, V, T).astype(np.uint32)
    y, r = ref.rmsnorm(x)
    de, dg = poisoned((T, D)), poisoned((D,))
    rmsnorm_bwd_gain[s.gain_grid](_t(dx), _t(x), _t(r), _t(g), de, de, dg, T, WRITE_BF16=False,
                                  DY_PARTS=1, **s.norm, **GAIN)
    nxt = _links(s, ids)
    words = V * D                                                 # all of dE through w1
    _, _, w1, _ = _embed_grad(s, ids, nxt, de, np.zeros((2, D), np.float32), words)
    want, want_dg = ref.embed_backward(dx, y, r, g, ids.astype(np.int64), V)
    assert_close("dE", f32(w1)[:words].reshape(V, D), want, ELEMENTWISE)
    assert_close("embed_backward.dg", f32(dg), want_dg, GAIN_SUM)


@pytest.mark.parametrize("n", [2500, 1, 1024])   # a partial last block, one word, whole blocks
def test_copy_f32_exact_and_bounded(n):
    src = RNG.standard_normal(3000).astype(np.float32)
    dst = poisoned((3100,))
    copy_f32[(cdiv(n, 1024),)](_t(src), dst, n, BLOCK=1024)
    assert_bitwise("copy", f32(dst)[:n], src[:n])
    assert_unwritten("copy past N", dst[n:])
