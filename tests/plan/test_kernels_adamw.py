"""AdamW and the bf16 cast in Triton's interpreter against the reference learner: t formed from
t_base + doorbell, gains not decayed, bf16 copy written, awkward N.  The whole-plane kernel checked
here is the tests' oracle of the fused updates (tests/support/adamw_oracle.py,
tests/plan/test_kernels_weight_grad.py); cast_bf16 is the product's."""
from __future__ import annotations

import numpy as np
import pytest
from tests.support.adamw_oracle import adamw, oracle_constexprs
from tests.support.kernels_support import assert_close, assert_written, f32, poisoned
from tests.support.tolerances import ADAMW_REL, EXACT

import torch
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.plan.kernels.adamw import cast_bf16


def _tiny_planes(rng, n):
    P = rng.standard_normal(n).astype(np.float32) * 0.02
    M = rng.standard_normal(n).astype(np.float32) * 1e-3
    V = np.abs(rng.standard_normal(n).astype(np.float32)) * 1e-6
    G = rng.standard_normal(n).astype(np.float32) * 1e-3
    G[:7] = M[:7] = V[:7] = 0.0                            # no gradient, no moments: pure decay
    return P, M, V, G


@pytest.mark.parametrize("t_base,doorbell", [(-1, 2), (4998, 7)])
def test_adamw_matches_reference_learner(t_base, doorbell):
    prof = profiles.get("tiny")
    # the whole-plane kernel runs in no launch list (AdamW rides in the weight-gradient
    # epilogues and embed_grad); it is the oracle those are checked against
    consts = oracle_constexprs(prof, 4096)                  # 123 programs, last one partial
    n = prof.parameter_count
    rng = np.random.default_rng(t_base + 5)
    P, M, V, G = _tiny_planes(rng, n)
    pmv = torch.from_numpy(np.concatenate([P, M, V]))
    w16 = poisoned((n,), torch.bfloat16)
    bell = torch.tensor([doorbell], dtype=torch.int32)
    adamw[(-(-n // 4096),)](pmv, torch.from_numpy(G), w16, bell, t_base, n, **consts)
    # w16 holds bf(P) where a matmul reads it; E (gathered in fp32) and the gains are left alone
    stale = np.zeros(n, bool)
    for name in ("embed", "g_embed", "g_final"):
        q = prof.parameter(name)
        stale[q.offset:q.end] = True
    assert_written("w16 (matrices the matmuls read)", w16[torch.from_numpy(~stale)])
    assert torch.isnan(w16[torch.from_numpy(stale)].float()).all(), "AdamW wrote w16 of E or a gain"
    t = t_base + doorbell
    P2, M2, V2 = ref.adamw(prof, P, M, V, G, t)
    got = f32(pmv)
    assert_close("P", got[:n], P2, ADAMW_REL)
    assert_close("M", got[n:2 * n], M2, ADAMW_REL)
    assert_close("V", got[2 * n:], V2, ADAMW_REL)
    assert_close("w16", f32(w16)[~stale], ref.bf16(got[:n])[~stale], EXACT)
    # gains: not decayed; with g = 0 (first elements of E), a pure decay
    for name in ("g_embed", "g_final"):
        q = prof.parameter(name)
        assert_close(name, got[q.offset:q.end], P2[q.offset:q.end], ADAMW_REL)
    c = ref.adamw_constants(prof, t)
    assert np.array_equal(got[:7], P[:7] * c["decay"]), "matrix decay (g = 0) is not exact"


def test_cast_bf16_awkward_n():
    x = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    out = poisoned((5100,), torch.bfloat16)
    cast_bf16[(5,)](torch.from_numpy(x), out, 5000, BLOCK=1024)
    assert np.array_equal(f32(out)[:5000], ref.bf16(x)), "cast is not round-to-nearest-even"
    assert torch.isnan(out[5000:].float()).all(), "cast wrote past N"
