"""Reference numerics: bf16 round-to-nearest-even, rotary tables, the fp32 constants of docs/NUMERICS.md.

numpy only (no torch, no triton): the reference must stay independent of the kernels.  The bf16
rounding is the one definition of it: the interpret backend's fp32 → bf16 conversion
(host/backends/interpret.py) is `bf16_bits`, so the interpreter and the reference round alike.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from coppelius.plan.profiles import RMS_EPS as _RMS_EPS, ROPE_BASE as _ROPE_BASE

F32 = np.float32
RMS_EPS = F32(_RMS_EPS)                 # added to mean(x²) in fp32 (CONTRACT §3)

_BF16_ROUND_BIAS = np.uint32(0x7FFF)    # half an ulp of bf16 minus one: ties go to the even lsb
_BF16_KEEP = np.uint32(0xFFFF0000)      # the bits a bf16 value keeps of its fp32 word
_F32_QUIET_BIT = np.uint32(0x00400000)  # keeps a NaN a NaN once its low mantissa bits are dropped
_BF16_SHIFT = np.uint32(16)             # a bf16 value is the high half of its fp32 word


def bf16(x) -> np.ndarray:
    """Round to bfloat16, nearest-even, keeping float32 storage: same shape, dtype float32.

    Input is converted to float32 first (the reference only ever rounds fp32 values).  Overflow
    rounds to ±inf as RNE does; ±inf stays; NaN stays NaN (quieted, sign kept); subnormals round
    like any other value (no flush).
    """
    return _bf16_words(x).view(F32)


def bf16_bits(x) -> np.ndarray:
    """The bf16 bit patterns (uint16, same shape) of `bf16(x)`: what a bf16 tensor stores."""
    return (_bf16_words(x) >> _BF16_SHIFT).astype(np.uint16)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """bf16 bit patterns → the float32 values they stand for (exact: bf16 is fp32's high half)."""
    return (np.asarray(bits).astype(np.uint32) << _BF16_SHIFT).view(F32)


def _bf16_words(x) -> np.ndarray:
    """The fp32 words (uint32) of x rounded to bf16, nearest-even, their low halves zero."""
    x = np.asarray(x, dtype=F32)
    u = x.view(np.uint32)               # same itemsize: a view even of a strided array
    r = u >> _BF16_SHIFT
    r &= 1
    r += _BF16_ROUND_BIAS
    r += u                              # no wrap: the largest non-NaN word, -inf, is 0xFF800000
    r &= _BF16_KEEP
    if x.size and np.isnan(x.max()):    # max propagates NaN: one read pass, no mask (~0.25 ns/elem)
        r = np.where(np.isnan(x), (u | _F32_QUIET_BIT) & _BF16_KEEP, r)
    return r


def attention_scale(head_dim: int) -> np.float32:
    """d^-½ as one fp32 constant (rounded once from float64); 0.125 exactly for d = 64."""
    return F32(1.0 / math.sqrt(head_dim))


@functools.lru_cache(maxsize=8)
def _rotary_tables(context: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    half = head_dim // 2
    # math.cos/sin (libm) per element, not numpy's SIMD float64 paths: the tables must not depend
    # on which vector unit the machine has.  32,768 entries for the production profile: ~20 ms.
    freqs = [_ROPE_BASE ** (-(2.0 * i) / head_dim) for i in range(half)]
    angles = [pos * f for pos in range(context) for f in freqs]
    cos = np.array([math.cos(a) for a in angles], dtype=np.float64).astype(F32).reshape(context, half)
    sin = np.array([math.sin(a) for a in angles], dtype=np.float64).astype(F32).reshape(context, half)
    cos.flags.writeable = False
    sin.flags.writeable = False
    return cos, sin


def rotary_tables(profile) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (T, d/2) float32, read-only.

    angle[pos, i] = pos · 10000^(-2i/d) in float64, cos/sin in float64, rounded once to fp32 (CONTRACT §3).
    The table is applied to both halves of a head (rotate-half convention).
    """
    return _rotary_tables(profile.context, profile.head_dim)
