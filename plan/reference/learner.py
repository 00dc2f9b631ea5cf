"""Reference learner: fresh initialization (CONTRACT §4), the flat-plane views, and AdamW (NUMERICS.md).

numpy only.  The P, M and V planes are flat float32 vectors in the profile's parameter order.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from coppelius.plan.profiles import INIT_STD
from coppelius.plan.reference.elementary import cos, log     # the project's, not numpy's
from coppelius.plan.reference.numerics import F32

WORDS_PER_VALUE = 2             # Box–Muller draws one normal from two raw 64-bit words
_MANTISSA_SHIFT = 11            # 64-bit word → 53-bit uniform
_TWO_POW_M53 = 2.0 ** -53
_INIT_BATCH = 1 << 22           # values per Philox batch: bounds the float64 temporaries (~100 MB)


def unflatten(profile, plane: np.ndarray) -> dict[str, np.ndarray]:
    """Flat plane (parameter_count,) → {name: view with the parameter's shape}, in parameter order."""
    if plane.shape != (profile.parameter_count,):
        raise ValueError(f"plane has shape {plane.shape}, profile {profile.name!r} needs "
                         f"({profile.parameter_count},)")
    return {p.name: plane[p.offset:p.end].reshape(p.shape) for p in profile.parameters}


def _normals(words: np.ndarray) -> np.ndarray:
    """Raw words (2n,) uint64 → (n,) float32 = fp32(0.02 · sqrt(-2 ln u1) · cos(2π u2)), float64 inside.

    ln and cos are the project's (plan/reference/elementary.py), not numpy's, whose float64 log
    and cos take another path on an AVX-512 CPU: the first parameters of every backend must not
    depend on the machine that drew them (the same bits as numpy's on this AVX2 machine for all
    57,705,472 of the production profile)."""
    a, b = words[0::2], words[1::2]
    u1 = ((a >> np.uint64(_MANTISSA_SHIFT)) + np.uint64(1)).astype(np.float64) * _TWO_POW_M53
    u2 = (b >> np.uint64(_MANTISSA_SHIFT)).astype(np.float64) * _TWO_POW_M53
    z = np.sqrt(-2.0 * log(u1)) * cos((2.0 * math.pi) * u2)
    return (INIT_STD * z).astype(F32)


def init_parameters(profile) -> np.ndarray:
    """The fresh P plane (parameter_count,) float32: gains 1, matrices N(0, 0.02²) (CONTRACT §4).

    One stream, numpy.random.Philox(key=seed).random_raw, read in parameter order; gains consume
    no words.  Pure function of the seed: same bits in every process.
    """
    P = np.empty(profile.parameter_count, dtype=F32)
    gen = np.random.Philox(key=profile.seed)
    for p in profile.parameters:
        view = P[p.offset:p.end]
        if len(p.shape) == 1:
            view[:] = 1.0
            continue
        for start in range(0, p.size, _INIT_BATCH):
            n = min(_INIT_BATCH, p.size - start)
            view[start:start + n] = _normals(gen.random_raw(WORDS_PER_VALUE * n))
    return P


def decay_mask(profile) -> np.ndarray:
    """(parameter_count,) bool: True on the matrices AdamW decays (E, every W*, Whead)."""
    mask = np.zeros(profile.parameter_count, dtype=bool)
    for p in profile.parameters:
        mask[p.offset:p.end] = p.decay
    return mask


def _f32(x: Fraction) -> np.float32:
    return F32(x.numerator / x.denominator)     # one rounding: correctly rounded division, then fp32


def adamw_constants(profile, t: int) -> dict[str, np.float32]:
    """The fp32 constants of one AdamW update at update count t (NUMERICS.md §AdamW)."""
    if t < 1:
        raise ValueError(f"AdamW update count t must be ≥ 1 (the count after the step), got {t}")
    lr = profile.learner
    r_lr, r_b1, r_b2 = (Fraction(x.numerator, x.denominator) for x in (lr.lr, lr.beta1, lr.beta2))
    r_wd, r_eps = (Fraction(x.numerator, x.denominator) for x in (lr.decay, lr.epsilon))
    b1, b2 = float(r_b1), float(r_b2)
    bc1 = 1.0 - b1 ** t                          # float64, as NUMERICS says
    bc2 = 1.0 - b2 ** t
    return {
        "decay": _f32(1 - r_lr * r_wd),
        "beta1": _f32(r_b1), "one_minus_beta1": _f32(1 - r_b1),
        "beta2": _f32(r_b2), "one_minus_beta2": _f32(1 - r_b2),
        "eps": _f32(r_eps),
        "step_size": F32(float(r_lr) / bc1),
        "bc2_sqrt": F32(math.sqrt(bc2)),
    }


def adamw(profile, P: np.ndarray, M: np.ndarray, V: np.ndarray, G: np.ndarray, t: int):
    """One AdamW update over flat planes (each (parameter_count,) float32) → new (P, M, V).

    t is the update count after this step.  The inputs are not modified.  Per element, fp32:
    p *= decay (matrices only); m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g·g;
    p -= step_size·m / (sqrt(v)/bc2_sqrt + eps).
    """
    n = profile.parameter_count
    for name, plane in (("P", P), ("M", M), ("V", V), ("G", G)):
        if plane.shape != (n,) or plane.dtype != F32:
            raise ValueError(f"AdamW plane {name} is {plane.dtype}{plane.shape}, needs float32({n},)")
    c = adamw_constants(profile, t)
    P = P.copy()
    for p in profile.parameters:
        if p.decay:
            P[p.offset:p.end] *= c["decay"]
    M = M * c["beta1"]
    M += G * c["one_minus_beta1"]
    g2 = G * c["one_minus_beta2"]
    g2 *= G
    V = V * c["beta2"]
    V += g2
    denom = np.sqrt(V, out=g2)
    denom /= c["bc2_sqrt"]
    denom += c["eps"]
    upd = M * c["step_size"]
    upd /= denom
    P -= upd
    return P, M, V
