"""The whole-plane AdamW kernel: the oracle the fused updates must match bit for bit.

No launch list runs it: AdamW rides in the weight-gradient epilogues (plan/kernels/weight_grad.py)
and in embed_grad / embed_decay.  It is the plainest form of the same update — one element per
lane over a flat P/M/V plane, built from the product's jit helpers (plan/kernels/adamw.py's
bias_corrections and adamw_update) — so the fused kernels are checked against it
(tests/plan/test_kernels_weight_grad.py, test_kernels_rows.py) and it against the reference learner
(tests/plan/test_kernels_adamw.py).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from tests.support.kernels_support import f32, poisoned

from coppelius.plan.launches import builders as launch_builders
from coppelius.plan.kernels.adamw import adamw_update, bias_corrections
from coppelius.plan.ints import cdiv

ORACLE_BLOCK = 1024             # elements per program of `adamw_planes` (any block: the same bits)


@triton.jit
def adamw(pmv_ptr, grad_ptr, w16_ptr, doorbell_ptr, t_base, N,
          GAIN0_START: tl.constexpr, GAIN0_END: tl.constexpr,
          GAIN1_START: tl.constexpr, GAIN1_END: tl.constexpr,
          EMBED_START: tl.constexpr, EMBED_END: tl.constexpr,
          LR: tl.constexpr, BETA1_F64: tl.constexpr, BETA2_F64: tl.constexpr,
          DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
          BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
          BLOCK: tl.constexpr):
    """One update of N parameters from a gradient plane; the fp32 constants arrive already
    rounded to fp32 (oracle_constexprs).  The gains are not decayed; w16 = bf(p)
    is written outside the gains and E (embed_fwd gathers E's fp32 rows)."""
    step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
    p = tl.load(pmv_ptr + offs, mask=mask, other=0.0)
    m = tl.load(pmv_ptr + N + offs, mask=mask, other=0.0)
    v = tl.load(pmv_ptr + 2 * N + offs, mask=mask, other=0.0)
    gain = ((offs >= GAIN0_START) & (offs < GAIN0_END)) | ((offs >= GAIN1_START) & (offs < GAIN1_END))
    p, m, v = adamw_update(tl.where(gain, p, p * DECAY), m, v, g, step_size, bc2_sqrt,
                           BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
    tl.store(pmv_ptr + offs, p, mask=mask)
    tl.store(pmv_ptr + N + offs, m, mask=mask)
    tl.store(pmv_ptr + 2 * N + offs, v, mask=mask)
    embed = (offs >= EMBED_START) & (offs < EMBED_END)
    tl.store(w16_ptr + offs, p.to(tl.bfloat16), mask=mask & ~(gain | embed))


def oracle_constexprs(profile, block: int) -> dict:
    """The whole-plane kernel's constexprs: the ranges of the profile's two undecayed parameters
    (the gains) and of E, the learner's constants as the fused updates bake them
    (launch_builders.learner_constexprs), and BLOCK."""
    gains = [q for q in profile.parameters if not q.decay]
    if len(gains) != 2:
        raise ValueError(f"profile {profile.name}: the oracle expects two undecayed ranges, "
                         f"got {len(gains)}")
    embed = profile.parameter("embed")
    return {"GAIN0_START": gains[0].offset, "GAIN0_END": gains[0].end,
            "GAIN1_START": gains[1].offset, "GAIN1_END": gains[1].end,
            "EMBED_START": embed.offset, "EMBED_END": embed.end,
            **launch_builders.learner_constexprs(profile), "BLOCK": block}


def adamw_planes(profile, g: np.ndarray, P, M, V, t_base: int, doorbell: int, decayed: bool = True):
    """The oracle's update of one parameter (n = g.size elements, a decayed matrix or, with
    decayed=False, a gain) at t = t_base + doorbell with `profile`'s learner → its new
    (P, M, V, w16), fp32 arrays (w16 NaN where the kernel leaves it: a gain's)."""
    n = g.size
    pmv = torch.from_numpy(np.concatenate([P, M, V]))
    w16 = poisoned((n,), torch.bfloat16)
    gain = (n, n) if decayed else (0, n)
    c = dict(oracle_constexprs(profile, ORACLE_BLOCK), GAIN0_START=gain[0],
             GAIN0_END=gain[1], GAIN1_START=n, GAIN1_END=n, EMBED_START=n, EMBED_END=n)
    adamw[(cdiv(n, ORACLE_BLOCK),)](pmv, torch.from_numpy(np.ascontiguousarray(g.reshape(-1))),
                                    w16, torch.tensor([doorbell], dtype=torch.int32), t_base, n, **c)
    out = f32(pmv)
    return out[:n], out[n:2 * n], out[2 * n:], f32(w16)
