"""The project's elementary functions: exp, exp2, log, log2, sin, cos from IEEE basic operations.

numpy's own `np.exp`, `np.log`, `np.sin`, … pick an implementation by the CPU they run on (SIMD
paths for AVX2 and AVX-512, glibc's libm elsewhere, other code on aarch64), and those differ in
the last bits: on a 2-core AMD EPYC without AVX-512, `NPY_DISABLE_CPU_FEATURES=X86_V3` alone (numpy
2.4 then skips its AVX2 loops) changed the float32 `np.exp` of 393,243 of 1,000,001 inputs
evenly spaced in [-5, 5], by up to 2 ulps (2026-12-08).
These functions use nothing but what IEEE 754 rounds correctly everywhere — `+ - * /`, `rint`,
`frexp`, `ldexp`, comparisons and float64 → float32 conversion, each a separate numpy call, so no
compiler can contract a product and a sum into an FMA — in one fixed order, so the same input
gives the same bits on every x86-64 CPU and on aarch64.

Every function evaluates in float64 (range reduction, then a Taylor polynomial of exact rational
coefficients rounded once to float64) and returns the input's dtype.  For float32 inputs the float64
value is within ~3e-13 relative of the true one (the polynomial's remainder; the degrees below)
and is then rounded once to float32: the correctly rounded float32 value except where the true
value lies within that distance of a float32 rounding midpoint (none among the tests' ~10,000
samples, tests/plan/test_elementary.py, where numpy's AVX2 exp missed 37 % of them).  For float64
inputs the result is within 2 float64 ulps.  Specials are IEEE's: exp(-inf) = 0,
exp(+inf) = +inf, log(0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN in, NaN out,
sin/cos(±inf) = NaN.

Who uses them: the interpret backend, for every `tl.exp`, `tl.exp2`, `tl.log`, `tl.log2`,
`tl.sin` and `tl.cos` a kernel evaluates (host/backends/interpreter_repairs.py), and the fresh
initialization's Box–Muller (plan/reference/learner.py), whose float64 log and cos reach every
backend's first parameters.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32
F64 = np.float64

# π to 60 significant digits (more than the three-part split below can use).
_PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494")
_LN2 = Fraction("0.693147180559945309417232121458176568075500134360255254120680")
_SPLIT_BITS = 33                 # significant bits kept per part of a split constant, so that
                                 # n · part is exact in float64 for every |n| < 2^20


def _split(value: Fraction, parts: int) -> tuple[float, ...]:
    """`value` as `parts` float64 numbers of _SPLIT_BITS significant bits each (the last one is
    the rounded rest), largest first: Cody–Waite's constant for an exact n · part."""
    out, rest = [], value
    for _ in range(parts - 1):
        exponent = math.frexp(float(rest))[1]
        quantum = Fraction(2) ** (exponent - _SPLIT_BITS)
        head = math.floor(rest / quantum) * quantum
        out.append(float(head))                  # exact: _SPLIT_BITS bits
        rest -= head
    out.append(float(rest))
    return tuple(out)


LN2_HI, LN2_LO = _split(_LN2, 2)
INV_LN2 = float(1 / _LN2)
LN2 = float(_LN2)
PIO2_1, PIO2_2, PIO2_3 = _split(_PI / 2, 3)
TWO_OVER_PI = float(2 / _PI)

# Taylor coefficients, each one rounding of the exact rational, and the degrees each dtype needs:
# a float32 result wants the float64 value within ~2^-40 relative (then only a true value within
# 2^-40 of a float32 midpoint can round the other way), a float64 one within a few ulps.  exp's
# remainder on |r| ≤ ln2/2 after r^10 is < 3e-13, after r^13 < 5e-18; sin's after r^15 and cos's
# after r^14 on |r| ≤ π/4 are < 1e-14, after r^19 / r^18 < 1e-18; log's atanh series in s = f²,
# |f| ≤ 0.1716, after s^7 is < 1e-12, after s^12 < 5e-19.
_EXP = {F32: 11, F64: 14}
_SIN_COS = {F32: 8, F64: 10}
_ATANH = {F32: 8, F64: 13}
EXP_COEFFICIENTS = tuple(float(Fraction(1, math.factorial(k))) for k in range(max(_EXP.values())))
SIN_COEFFICIENTS = tuple(float(Fraction((-1) ** k, math.factorial(2 * k + 1)))
                         for k in range(max(_SIN_COS.values())))
COS_COEFFICIENTS = tuple(float(Fraction((-1) ** k, math.factorial(2 * k)))
                         for k in range(max(_SIN_COS.values())))
ATANH_COEFFICIENTS = tuple(float(Fraction(1, 2 * k + 1)) for k in range(max(_ATANH.values())))
_SQRT_HALF = math.sqrt(0.5)         # the log reduction's cut (any value near √½ would do)

# Past these the float32 / float64 result is 0 or inf whatever the polynomial says; clamping keeps
# n = rint(x / ln2) and 2^n finite.
_EXP_RANGE = {F32: (-104.0, 89.0), F64: (-746.0, 710.0)}
_EXP2_RANGE = {F32: (-150.0, 129.0), F64: (-1076.0, 1025.0)}
# |x| below which sin/cos reduce in float64 (n · PIO2_k exact for |n| < 2^20); larger arguments
# (none in the kernels, whose angles stay below 2^11) are reduced exactly, one by one, in
# rational arithmetic against π to _PI_BITS bits.
SINCOS_FAST_REDUCTION = 2.0 ** 19
_PI_BITS = 1200                     # float64 reaches 2^1024: ~1,100 bits keep r exact to 2^-60


def _horner(coefficients, x: np.ndarray) -> np.ndarray:
    """Σ c_k x^k, highest first: one multiply and one add per coefficient, in this order, in place
    (a 64 × 128 float64 tile: ~5 µs per operation here, an allocation each would add half again)."""
    acc = np.full_like(x, coefficients[-1])
    for c in coefficients[-2::-1]:
        np.multiply(acc, x, out=acc)
        np.add(acc, c, out=acc)
    return acc


def _float_kind(x) -> tuple[np.ndarray, type]:
    a = np.asarray(x)
    if a.dtype == F32:
        return a.astype(F64), F32
    if a.dtype == F64:
        return a.copy(), F64
    raise TypeError(f"elementary functions take float32 or float64 arrays, not {a.dtype} "
                    "(convert first: the kernels evaluate them on fp32 and fp64 only)")


def _finish(y64: np.ndarray, kind, x64: np.ndarray, special=()) -> np.ndarray:
    """Round once to the input's dtype, set the `special` (mask, value) pairs, and give every NaN
    one bit pattern (numpy's NaN): an x86 CPU and an ARM one make different default NaNs."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = y64.astype(kind)
    for mask, value in special:
        y[mask] = value
    if y.size and np.isnan(y.max()):     # max propagates NaN: one pass, no mask
        y[np.isnan(y)] = np.nan
    return y


def exp(x) -> np.ndarray:
    """e^x: n = rint(x/ln2), r = (x − n·ln2_hi) − n·ln2_lo, e^r by Taylor, times 2^n (exact)."""
    x64, kind = _float_kind(x)
    lo, hi = _EXP_RANGE[kind]
    with np.errstate(invalid="ignore", over="ignore"):
        np.clip(x64, lo, hi, out=x64)            # NaN stays NaN, and so does everything below
        n = np.rint(x64 * INV_LN2)
        x64 -= n * LN2_HI
        x64 -= n * LN2_LO
        y = np.ldexp(_horner(EXP_COEFFICIENTS[:_EXP[kind]], x64), n.astype(np.int32))
    return _finish(y, kind, x64)


def exp2(x) -> np.ndarray:
    """2^x: n = rint(x), e^((x − n)·ln2) by exp's polynomial, times 2^n (x − n is exact)."""
    x64, kind = _float_kind(x)
    lo, hi = _EXP2_RANGE[kind]
    with np.errstate(invalid="ignore", over="ignore"):
        np.clip(x64, lo, hi, out=x64)
        n = np.rint(x64)
        x64 -= n
        x64 *= LN2
        y = np.ldexp(_horner(EXP_COEFFICIENTS[:_EXP[kind]], x64), n.astype(np.int32))
    return _finish(y, kind, x64)


def _log_parts(x64: np.ndarray, kind) -> tuple[np.ndarray, np.ndarray]:
    """x = m · 2^e with m in [√½, √2): (e, ln m) in float64, ln m = 2 atanh((m−1)/(m+1))."""
    positive = np.isfinite(x64) & (x64 > 0)
    m, e = np.frexp(np.where(positive, x64, 1.0))       # m in [½, 1), exact
    low = m < _SQRT_HALF
    m[low] *= 2.0                                       # exact
    e[low] -= 1
    f = (m - 1.0) / (m + 1.0)                           # m − 1 exact (Sterbenz)
    ln_m = _horner(ATANH_COEFFICIENTS[:_ATANH[kind]], f * f)
    ln_m *= f + f
    return e.astype(F64), ln_m


def _log_specials(x64: np.ndarray):
    return ((x64 == 0, -np.inf), (x64 < 0, np.nan), (np.isposinf(x64), np.inf),
            (np.isnan(x64), np.nan))


def log(x) -> np.ndarray:
    """ln x = e·ln2 + ln m."""
    x64, kind = _float_kind(x)
    e, ln_m = _log_parts(x64, kind)
    e *= LN2
    e += ln_m
    return _finish(e, kind, x64, _log_specials(x64))


def log2(x) -> np.ndarray:
    """log2 x = e + ln m / ln2 (exact at powers of two: m = 1 gives ln m = 0)."""
    x64, kind = _float_kind(x)
    e, ln_m = _log_parts(x64, kind)
    ln_m *= INV_LN2
    e += ln_m
    return _finish(e, kind, x64, _log_specials(x64))


def _pi_bits() -> Fraction:
    """π to _PI_BITS bits by Machin's formula, π/4 = 4 atan(1/5) − atan(1/239), in integers."""
    one = 1 << (_PI_BITS + 16)

    def atan_inv(k: int) -> int:
        total, term, n, sign = 0, one // k, 1, 1
        while term:
            total += sign * (term // n)
            term //= k * k
            n += 2
            sign = -sign
        return total

    return Fraction(4 * (4 * atan_inv(5) - atan_inv(239)), one)


_EXACT_PI: list[Fraction] = []


def _reduce_exactly(value: float) -> tuple[float, float]:
    """(n, r) with value = n·π/2 + r exactly up to 2^-_PI_BITS relative, r rounded once."""
    if not _EXACT_PI:
        _EXACT_PI.append(_pi_bits())
    half_pi = _EXACT_PI[0] / 2
    v = Fraction(value)
    n = round(v / half_pi)
    return float(n % 4), float(v - n * half_pi)


def _sincos_parts(x64: np.ndarray, kind):
    """x = n·π/2 + r, |r| ≤ ~π/4: (quadrant n mod 4, sin r, cos r); Cody–Waite in three parts
    below SINCOS_FAST_REDUCTION, exact rational reduction above it."""
    finite = np.isfinite(x64)
    r = np.where(finite, x64, 0.0)
    n = np.rint(r * TWO_OVER_PI)
    r -= n * PIO2_1
    r -= n * PIO2_2
    r -= n * PIO2_3
    r = np.where(n == 0, np.where(finite, x64, 0.0), r)   # keeps the sign of −0.0
    quadrant = np.mod(n, 4.0)
    big = finite & (np.abs(x64) >= SINCOS_FAST_REDUCTION)
    if big.any():
        for i in zip(*np.nonzero(big)):
            quadrant[i], r[i] = _reduce_exactly(float(x64[i]))
    s = r * r
    terms = _SIN_COS[kind]
    sin_r = _horner(SIN_COEFFICIENTS[:terms], s)
    sin_r *= r
    cos_r = _horner(COS_COEFFICIENTS[:terms], s)
    return quadrant.astype(np.int8), sin_r, cos_r


def sin(x) -> np.ndarray:
    """sin x by quadrant: sin r, cos r, −sin r, −cos r."""
    x64, kind = _float_kind(x)
    q, s, c = _sincos_parts(x64, kind)
    y = np.choose(q, (s, c, -s, -c))
    return _finish(y, kind, x64, ((np.isinf(x64), np.nan), (np.isnan(x64), np.nan)))


def cos(x) -> np.ndarray:
    """cos x by quadrant: cos r, −sin r, −cos r, sin r."""
    x64, kind = _float_kind(x)
    q, s, c = _sincos_parts(x64, kind)
    y = np.choose(q, (c, -s, -c, s))
    return _finish(y, kind, x64, ((np.isinf(x64), np.nan), (np.isnan(x64), np.nan)))


def _blockwise(function):
    """Large arrays in blocks of _BLOCK elements: each of a function's ~40 passes then runs over
    a block the cache holds (4 Mi float64 log and cos, the initialization's batch: 4.1 s whole,
    1.9 s in blocks of 2^14, on a loaded 2-core machine)."""
    def blocked(x):
        a = np.asarray(x)
        if a.size <= _BLOCK:
            return function(a)
        flat = a.reshape(-1)
        out = np.empty(flat.shape, dtype=a.dtype)
        for start in range(0, flat.size, _BLOCK):
            out[start:start + _BLOCK] = function(flat[start:start + _BLOCK])
        return out.reshape(a.shape)
    blocked.__name__, blocked.__qualname__, blocked.__doc__ = \
        function.__name__, function.__qualname__, function.__doc__
    return blocked


_BLOCK = 1 << 14
exp, exp2, log, log2, sin, cos = (_blockwise(f) for f in (exp, exp2, log, log2, sin, cos))

FUNCTIONS = {"exp": exp, "exp2": exp2, "log": log, "log2": log2, "sin": sin, "cos": cos}
