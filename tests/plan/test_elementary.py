"""The project's elementary functions (plan/reference/elementary.py) against exact arithmetic.

Correct rounding is checked with Python's `decimal` (its exp and ln are correctly rounded at any
precision; sin is a Taylor series in 60 digits here), one float32 candidate against its two
neighbours.  That the functions do not depend on the CPU is checked by construction — numpy's own
transcendental functions are made to raise while they run — and end to end by
tests/host/run/test_cpu_independence.py.
"""
from __future__ import annotations

import decimal

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from coppelius.plan.reference import elementary as E

D = decimal.Decimal
CTX = decimal.Context(prec=60)
F32 = np.float32


def _dsin(x: D, cosine: bool = False) -> D:
    with decimal.localcontext(decimal.Context(prec=90)):
        two_pi = D(E._pi_bits().numerator) * 2 / D(E._pi_bits().denominator)
        x = x - (x / two_pi).to_integral_value() * two_pi         # |x| ≤ π: the series converges
        term = D(1) if cosine else x
        total, k = term, 1 if cosine else 2
        while abs(term) > D(10) ** -58:
            term = -term * x * x / (k * (k + 1))
            total += term
            k += 2
        return total


def exact(name: str, x: float) -> D:
    d = D(float(x))
    return {"exp": lambda: CTX.exp(d), "log": lambda: CTX.ln(d),
            "exp2": lambda: CTX.power(D(2), d), "log2": lambda: CTX.divide(CTX.ln(d), CTX.ln(D(2))),
            "sin": lambda: _dsin(d), "cos": lambda: _dsin(d, cosine=True)}[name]()


def correctly_rounded(value: F32, truth: D) -> bool:
    """No float32 neighbour of `value` is nearer the truth (a tie may go either way)."""
    if not np.isfinite(value):
        return False
    here = abs(D(float(value)) - truth)
    for n in (np.nextafter(value, F32(np.inf)), np.nextafter(value, F32(-np.inf))):
        if np.isfinite(n) and abs(D(float(n)) - truth) < here:
            return False
    return True


SAMPLES = {          # float32 inputs where the function is finite and not 0 (a few thousand each)
    "exp": lambda rng: np.concatenate([rng.uniform(-103, 88.7, 1500), rng.uniform(-2, 2, 1500)]),
    "exp2": lambda rng: rng.uniform(-149, 127.9, 1500),
    "log": lambda rng: np.exp(rng.uniform(-100, 88, 2000)),
    "log2": lambda rng: np.exp(rng.uniform(-100, 88, 1500)),
    "sin": lambda rng: rng.uniform(-1100, 1100, 1500),
    "cos": lambda rng: rng.uniform(-1100, 1100, 1500),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_float32_results_are_correctly_rounded_on_the_sample(name):
    rng = np.random.default_rng(sorted(SAMPLES).index(name))
    x = SAMPLES[name](rng).astype(F32)
    got = E.FUNCTIONS[name](x)
    assert got.dtype == F32 and got.shape == x.shape
    bad = [i for i in range(x.size) if not correctly_rounded(got[i], exact(name, x[i]))]
    assert not bad, (f"{len(bad)} of {x.size} not correctly rounded; worst first: "
                     f"{name}({x[bad[0]]!r}) = {got[bad[0]]!r}, "
                     f"truth {exact(name, x[bad[0]]):.12e}")


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-103.0, max_value=88.5))
def test_exp_is_correctly_rounded_anywhere(x):
    got = E.exp(np.array([x], F32))[0]
    truth = exact("exp", x)
    if truth < D(float(np.finfo(F32).smallest_subnormal)) / 2:
        assert got == 0
    else:
        assert correctly_rounded(got, truth), f"exp({x!r}) = {got!r}, truth {truth:.12e}"


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=0.0,
                 exclude_min=True))
def test_log_is_correctly_rounded_anywhere_including_subnormals(x):
    got = E.log(np.array([x], F32))[0]
    assert correctly_rounded(got, exact("log", x)), f"log({x!r}) = {got!r}"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_float64_results_lie_within_two_ulps(name):
    """float64 inputs (the kernels' rotary frequencies and angles, the initialization's log and
    cos) are not rounded to float32 after: within 2 float64 ulps of the truth."""
    rng = np.random.default_rng(11)
    x = SAMPLES[name](rng)[:400].astype(np.float64)
    got = E.FUNCTIONS[name](x)
    assert got.dtype == np.float64
    worst = 0.0
    for xi, yi in zip(x, got):
        truth = exact(name, xi)
        ulp = D(float(np.spacing(abs(float(truth)))))
        worst = max(worst, float(abs(D(float(yi)) - truth) / ulp))
    assert worst <= 2.0, f"{name}: worst error {worst:.2f} float64 ulps"


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == F32 else np.uint64)


SPECIAL_CASES = [   # (function, input, expected) — IEEE's answers, signs of zero included
    ("exp", -np.inf, 0.0), ("exp", np.inf, np.inf), ("exp", 0.0, 1.0), ("exp", -0.0, 1.0),
    ("exp", 89.0, np.inf), ("exp", -104.0, 0.0), ("exp2", 10.0, 1024.0),
    ("exp2", -149.0, 2.0 ** -149),
    ("exp2", 128.0, np.inf), ("log", 0.0, -np.inf), ("log", -0.0, -np.inf), ("log", 1.0, 0.0),
    ("log", np.inf, np.inf), ("log", -1.0, np.nan), ("log", -np.inf, np.nan), ("log2", 8.0, 3.0),
    ("log2", 2.0 ** -149, -149.0), ("sin", 0.0, 0.0), ("sin", -0.0, -0.0), ("cos", 0.0, 1.0),
    ("sin", np.inf, np.nan), ("cos", -np.inf, np.nan),
] + [(name, np.nan, np.nan) for name in sorted(SAMPLES)]


@pytest.mark.parametrize("dtype", [F32, np.float64])
@pytest.mark.parametrize("name, x, want", SPECIAL_CASES)
def test_specials_and_one_nan(name, x, want, dtype):
    """Every NaN out is numpy's NaN bit for bit (x86 and ARM make different default NaNs)."""
    got = E.FUNCTIONS[name](np.array([x], dtype))
    if dtype == np.float64 and name == "exp" and x in (89.0, -104.0):    # finite in float64
        assert abs(D(float(got[0])) / exact(name, x) - 1) < D(2) ** -51
        return
    expected = np.array([want if dtype == F32 or x != 128.0 else 2.0 ** 128], dtype)
    assert bits(got)[0] == bits(expected)[0], f"{name}({x}) = {got[0]!r}, IEEE: {expected[0]!r}"


def test_huge_angles_are_reduced_exactly():
    """Beyond 2^19 the reduction is exact rational arithmetic: sin and cos stay in [-1, 1] and
    agree with the exact values up to the float64 rounding (the float32 3.4e38 has its exact
    reduction here: sin(3.4e38 as float64))."""
    x = np.array([2.0 ** 19, 1e6, -1e7, 1e22, 3.4e38, 1e300], np.float64)
    for name in ("sin", "cos"):
        got = E.FUNCTIONS[name](x)
        assert np.all(np.abs(got) <= 1.0)
        for xi, yi in zip(x[:3], got[:3]):
            assert abs(D(float(yi)) - exact(name, xi)) < D(2) ** -50, (name, xi, yi)


def test_blocks_and_shapes_do_not_change_a_bit():
    """A large array is evaluated in blocks: any shape, any block boundary, the same bits as one
    element at a time."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-20, 20, (3, 7, 1601)).astype(F32)          # 33,621: two blocks and a rest
    for name, fn in E.FUNCTIONS.items():
        arg = np.abs(x) if name.startswith("log") else x
        whole = fn(arg)
        assert whole.shape == x.shape
        one_by_one = np.array([fn(v.reshape(1))[0] for v in arg.reshape(-1)[::97]])
        assert (bits(whole.reshape(-1)[::97]) == bits(one_by_one)).all(), name


def test_no_numpy_transcendental_runs_inside(monkeypatch):
    """Built from basic operations only: with numpy's exp, log, sin, cos, … made to raise, every
    function still answers."""
    def forbidden(*a, **k):
        raise AssertionError("a numpy transcendental function ran")
    for name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "log10", "sin", "cos", "tan",
                 "sinh", "cosh", "tanh", "power", "float_power"):
        monkeypatch.setattr(np, name, forbidden)
    x = np.linspace(0.5, 3.0, 41)
    for fn in E.FUNCTIONS.values():
        fn(x.astype(F32))
        fn(x)


def test_unsupported_dtype_is_refused_by_name():
    with pytest.raises(TypeError, match="float32 or float64"):
        E.exp(np.arange(4))
