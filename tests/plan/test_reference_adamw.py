"""The reference AdamW against torch.optim.AdamW: three steps, the third a continuation at t = 1001."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from coppelius.plan import profiles
from coppelius.plan import reference

PROFILE = profiles.get("tiny")
LR = PROFILE.learner

# Element-wise bound in units of the fp32 spacing at the larger magnitude of the two values
# compared.  torch forms m with lerp (m + (1−β1)(g − m)) and the step as p + (−s)·(m/denom); the
# reference follows NUMERICS.md (β1·m + (1−β1)·g; p − s·m/denom): each differs by a few roundings.
# P's and M's spacing is taken at the larger of their terms too: where β1·m and (1−β1)·g (or
# p·decay and the update, at most the step size) nearly cancel, the roundings are ulps of the
# terms, not of the result.  Observed worst 2026-11-29: P 2 ulp, M 2 ulp, V 1 ulp.
ULPS = {"P": 4, "M": 4, "V": 2}


def _planes(seed: int):
    """P from init with perturbed gains; a gradient with per-tensor scales 1e-4…1 and exact zeros."""
    rng = np.random.default_rng(seed)
    P = reference.init_parameters(PROFILE)
    G = np.empty_like(P)
    for i, p in enumerate(PROFILE.parameters):
        if len(p.shape) == 1:
            P[p.offset:p.end] = 1 + 0.1 * rng.standard_normal(p.size)
        G[p.offset:p.end] = rng.standard_normal(p.size) * 10.0 ** -(i % 5)
    G[rng.random(G.size) < 0.01] = 0.0
    return P, G


def _torch_adamw(P, M, V, grads, t0: int):
    """Run torch.optim.AdamW over `grads` from state (P, M, V) at update count t0 → planes after each."""
    tensors = {n: torch.tensor(v.copy(), requires_grad=True) for n, v in reference.unflatten(PROFILE, P).items()}
    decay = [tensors[p.name] for p in PROFILE.parameters if p.decay]
    keep = [tensors[p.name] for p in PROFILE.parameters if not p.decay]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(LR.decay)},
                             {"params": keep, "weight_decay": 0.0}],
                            lr=float(LR.lr), betas=(float(LR.beta1), float(LR.beta2)),
                            eps=float(LR.epsilon))
    if t0:
        m, v = reference.unflatten(PROFILE, M), reference.unflatten(PROFILE, V)
        for n, x in tensors.items():
            opt.state[x] = {"step": torch.tensor(float(t0)), "exp_avg": torch.tensor(m[n].copy()),
                            "exp_avg_sq": torch.tensor(v[n].copy())}
    out = []
    for G in grads:
        g = reference.unflatten(PROFILE, G)
        for n, x in tensors.items():
            x.grad = torch.tensor(g[n].copy())
        opt.step()
        flat = lambda key: np.concatenate([(x.detach() if key is None else opt.state[x][key]).numpy().ravel()
                                           for x in tensors.values()])
        out.append((flat(None), flat("exp_avg"), flat("exp_avg_sq")))
    return out


def _check(name: str, ref: np.ndarray, other: np.ndarray, floor: np.ndarray | None = None):
    scale = np.maximum(np.abs(ref), np.abs(other))
    if floor is not None:
        scale = np.maximum(scale, floor)
    ulps = np.abs(ref.astype(np.float64) - other) / np.spacing(scale.astype(np.float32))
    i = int(np.argmax(ulps))
    print(f"{name}: worst {ulps[i]:.1f} ulp at {i}: ref {ref[i]!r} torch {other[i]!r}")
    assert ulps[i] <= ULPS[name[0]], f"{name}[{i}]: ref {ref[i]!r} torch {other[i]!r} ({ulps[i]:.1f} ulp)"


def test_adamw_matches_torch_three_steps_with_continuation():
    P, G1 = _planes(1)
    _, G2 = _planes(2)
    _, G3 = _planes(3)
    M = np.zeros_like(P)
    V = np.zeros_like(P)
    fresh = _torch_adamw(P, M, V, [G1, G2], 0)
    states = [(P, M, V)]
    for t, G in ((1, G1), (2, G2)):
        states.append(reference.adamw(PROFILE, *states[-1], G, t))
    # continuation: a new optimizer whose state says 1000 updates were made, then update 1001
    cont = _torch_adamw(*states[-1], [G3], 1000)
    states.append(reference.adamw(PROFILE, *states[-1], G3, 1001))
    for k, (theirs, (Pr, Mr, Vr), Gk, (Pprev, Mprev, _)) in enumerate(
            zip(fresh + cont, states[1:], (G1, G2, G3), states[:-1]), start=1):
        t = (1, 2, 1001)[k - 1]
        terms = np.maximum(float(LR.beta1) * np.abs(Mprev), (1 - float(LR.beta1)) * np.abs(Gk))
        step = float(reference.adamw_constants(PROFILE, t)["step_size"])     # bounds |update|
        _check(f"P t={t}", Pr, theirs[0], np.maximum(np.abs(Pprev), step))
        _check(f"M t={t}", Mr, theirs[1], terms)
        _check(f"V t={t}", Vr, theirs[2])


def test_adamw_decays_matrices_only_and_leaves_inputs_alone():
    P, _ = _planes(4)
    before = P.copy()
    zero = np.zeros_like(P)
    P1, M1, V1 = reference.adamw(PROFILE, P, zero, zero, zero, 7)
    assert np.array_equal(P, before) and not zero.any(), "adamw modified its inputs"
    assert not M1.any() and not V1.any()
    decay = reference.adamw_constants(PROFILE, 7)["decay"]
    for p in PROFILE.parameters:
        want = before[p.offset:p.end] * (decay if p.decay else np.float32(1))
        got = P1[p.offset:p.end]
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{p.name}[{bad[:1]}]: {got[bad[:1]]} != {want[bad[:1]]}"


def test_adamw_constants_are_the_rationals_rounded_once():
    c = reference.adamw_constants(PROFILE, 1)
    assert c["decay"] == np.float32(1 - 3e-4 * 0.1)
    assert c["beta1"] == np.float32(0.9) and c["one_minus_beta1"] == np.float32(0.1)
    assert c["beta2"] == np.float32(0.95) and c["one_minus_beta2"] == np.float32(0.05)
    assert c["eps"] == np.float32(1e-8)
    assert c["step_size"] == np.float32(3e-4 / (1 - 0.9))
    assert c["bc2_sqrt"] == np.float32((1 - 0.95) ** 0.5)
    late = reference.adamw_constants(PROFILE, 1001)
    assert late["step_size"] == np.float32(3e-4) and late["bc2_sqrt"] == np.float32(1.0)


def test_adamw_is_deterministic_and_refuses_bad_planes():
    P, G = _planes(5)
    M, V = G * 0.1, G * G
    a = reference.adamw(PROFILE, P, M, V, G, 3)
    b = reference.adamw(PROFILE, P, M, V, G, 3)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))
    with pytest.raises(ValueError, match="t must be"):
        reference.adamw(PROFILE, P, M, V, G, 0)
    with pytest.raises(ValueError, match="plane G"):
        reference.adamw(PROFILE, P, M, V, G[:-1], 1)
    with pytest.raises(ValueError, match="plane M"):
        reference.adamw(PROFILE, P, M.astype(np.float64), V, G, 1)
