"""The weight-gradient launch (plan/kernels/weight_grad.py) in Triton's interpreter.

AdamW in the epilogue must leave P, M, V and w16 bit for bit what the whole-plane oracle
(tests/support/adamw_oracle.py) makes of the same gradient (the plain `matmul` with the same tile: the
same accumulation), and within the reference learner's tolerance, whatever the grid (a program
loops over tiles pid, pid + programs, …: the side lane's launch has fewer programs than tiles).
Awkward shapes (32×32 tiles, 32-row K blocks): no dimension a multiple of its block, one weight
row, K below one block; P/M/V outside the products stay untouched, w16 outside them poisoned."""
from __future__ import annotations

import numpy as np
import pytest
from tests.support.adamw_oracle import adamw_planes
from tests.support.kernels_support import (assert_bitwise, assert_close, assert_unwritten, assert_written,
                             bf16_tensor, f32, poisoned)
from tests.support.tolerances import ADAMW_REL, SAME_OPERANDS

import torch
from coppelius.plan.launches import builders as launch_builders
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.kernels import meta
from coppelius.plan.kernels.matmul import matmul
from coppelius.plan.kernels.weight_grad import weight_grad
from coppelius.plan.ints import cdiv

RNG = np.random.default_rng(14)
PROF = profiles.get("tiny")
LEARNER = launch_builders.learner_constexprs(PROF)
BLOCKS = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2)
T_BASE, DOORBELL = 4998, 7                # t = 5005
GAP = 37                                  # P-plane words before, between and after the products
# (T, (M0, N0), (M1, N1) or None): T is the products' K
CASES = {
    "two_awkward": (80, (100, 72), (37, 45)),        # masks everywhere; K = 2.5 blocks; 12 + 4 tiles
    "one_weight_row": (80, (1, 72), (33, 20)),       # M = 1; 6 tiles
    "k_below_block": (20, (64, 32), None),           # K < BLOCK_K; one product, whole tiles
}
# programs: one per tile (0), or fewer, looping — 5 split two_awkward's 16 tiles 4, 3, 3, 3, 3,
# and programs 0, 2, 3 and 4 cross from product 0's 12 tiles into product 1's
GRIDS = {"one_per_tile": 0, "five_looping": 5}


def _planes(n):
    P = (0.02 * RNG.standard_normal(n)).astype(np.float32)
    M = (1e-3 * RNG.standard_normal(n)).astype(np.float32)
    V = np.abs(1e-6 * RNG.standard_normal(n)).astype(np.float32)
    return P, M, V


def _gradient(dy, x):
    """g = bf(dy)ᵀ @ bf(x) by the plain matmul (A stored (K, M)), the accumulation the fused
    kernel repeats."""
    (T, M), N = dy.shape, x.shape[1]
    c = poisoned((M, N))
    matmul[(cdiv(M, 32) * cdiv(N, 32),)](bf16_tensor(dy), bf16_tensor(x), c, c, M, N, T, A_T=True,
                                         B_T=False, EPILOGUE=meta.EPI_F32, SPLIT_K=1, **BLOCKS)
    return f32(c)


@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("case", list(CASES))
def test_weight_grad_adamw_is_todays_update(case, grid):
    T, p0, p1 = CASES[case]
    prods = [p0] + ([p1] if p1 else [])
    offsets, n = [], GAP
    for M, N in prods:
        offsets.append(n)
        n += M * N + GAP
    P, M_, V = _planes(n)
    pmv = torch.from_numpy(np.concatenate([P, M_, V]))
    w16 = poisoned((n,), torch.bfloat16)
    dys = [RNG.standard_normal((T, M)).astype(np.float32) for M, _ in prods]
    xs = [RNG.standard_normal((T, N)).astype(np.float32) for _, N in prods]
    ptrs = []
    for j in (0, 1):
        k = min(j, len(prods) - 1)
        ptrs += [bf16_tensor(dys[k]), bf16_tensor(xs[k]), pmv[offsets[k]:], w16[offsets[k]:]]
    (M0, N0), (M1, N1) = prods[0], prods[-1]
    tiles = sum(cdiv(M, 32) * cdiv(N, 32) for M, N in prods)
    programs = min(GRIDS[grid] or tiles, tiles)
    weight_grad[(programs,)](*ptrs, torch.tensor([DOORBELL], dtype=torch.int32),
                             T_BASE, M0, N0, M1, N1, T, n, PRODUCTS=len(prods), **LEARNER,
                             **BLOCKS)
    got = f32(pmv)
    Pk, Mk, Vk, Wk = got[:n], got[n:2 * n], got[2 * n:], f32(w16)
    untouched = np.ones(n, bool)
    t = T_BASE + DOORBELL
    for (M, N), off, dy, x in zip(prods, offsets, dys, xs):
        sl = slice(off, off + M * N)
        untouched[sl] = False
        g = _gradient(dy, x)
        assert_close("gradient vs the bf16 product", g, ref.bf16(dy).T @ ref.bf16(x), SAME_OPERANDS)
        want = adamw_planes(PROF, g, P[sl], M_[sl], V[sl], T_BASE, DOORBELL)
        for name, a, b in zip(("P", "M", "V", "w16"), (Pk[sl], Mk[sl], Vk[sl], Wk[sl]), want):
            assert_bitwise(f"{name} of the ({M}, {N}) product vs the whole-plane adamw", a, b)
        # and the reference learner on the same gradient (one decayed matrix of M·N elements)
        one = type("Q", (), {"name": "w", "offset": 0, "end": M * N, "decay": True})()
        learner = type("L", (), {"parameters": (one,), "parameter_count": M * N,
                                 "learner": PROF.learner})()
        Pr, Mr, Vr = ref.adamw(learner, P[sl], M_[sl], V[sl], g.reshape(-1), t)
        assert_close("P vs the reference learner", Pk[sl], Pr, ADAMW_REL)
        assert_close("M vs the reference learner", Mk[sl], Mr, ADAMW_REL)
        assert_close("V vs the reference learner", Vk[sl], Vr, ADAMW_REL)
    for name, a, b in (("P", Pk, P), ("M", Mk, M_), ("V", Vk, V)):
        assert_bitwise(f"{name} outside the products", a[untouched], b[untouched])
    assert_unwritten("w16 outside the products", w16[torch.from_numpy(untouched)])


SPLIT_CASES = {  # M, N, K, SPLIT_K (32-wide K blocks)
    "empty_last_split": (100, 72, 80, 4),    # 3 K blocks over 4 splits: the last one is empty
    "uneven": (1, 33, 200, 3),               # 7 blocks: 3 + 3 + 1; one row
    "unsplit": (37, 45, 20, 1),              # the usual kernel; K < BLOCK_K
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_k_partials_sum_in_order_to_the_product(case):
    M, N, K, S = SPLIT_CASES[case]
    a = RNG.standard_normal((M, K)).astype(np.float32)
    b = RNG.standard_normal((K, N)).astype(np.float32)
    c = poisoned((S + 1, M, N))                                     # one spare slab: not written
    matmul[(cdiv(M, 32) * cdiv(N, 32) * S,)](bf16_tensor(a), bf16_tensor(b), c, c, M, N, K,
                                             A_T=False, B_T=False, EPILOGUE=meta.EPI_F32,
                                             SPLIT_K=S, **BLOCKS)
    assert_written("partials", c[:S])
    assert_unwritten("past the partials", c[S])
    parts = f32(c[:S])
    total = parts[0]
    for s in range(1, S):
        total = total + parts[s]
    assert_close("Σ partials", total, ref.bf16(a) @ ref.bf16(b), SAME_OPERANDS)
    chunks, per = cdiv(K, 32), cdiv(cdiv(K, 32), S)
    for s in range(S):                                   # each partial is its own K range
        lo, hi = min(K, s * per * 32), min(K, (s + 1) * per * 32)
        want = (ref.bf16(a[:, lo:hi]) @ ref.bf16(b[lo:hi]) if hi > lo
                else np.zeros((M, N), np.float32))
        assert_close(f"partial {s} of {chunks} blocks", parts[s], want, SAME_OPERANDS)
