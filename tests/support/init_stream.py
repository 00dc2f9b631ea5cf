"""The matrix stream drawn independently of plan/reference/__init__.py: Philox4x64-10 and Box–Muller written
here from scratch (tests/plan/test_reference_init.py says why and checks them against Random123's
known answers), and a spot check of any profile's initial parameters against them."""
from __future__ import annotations

import math

import numpy as np

MASK64 = (1 << 64) - 1
PHILOX_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)    # Random123 philox4x64 multipliers
PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)    # Weyl key increments


def philox4x64_10(counter, key):
    c, k = list(counter), list(key)
    for rnd in range(10):
        if rnd:
            k = [(k[0] + PHILOX_W[0]) & MASK64, (k[1] + PHILOX_W[1]) & MASK64]
        p0, p1 = PHILOX_M[0] * c[0], PHILOX_M[1] * c[2]
        c = [(p1 >> 64) ^ c[1] ^ k[0], p1 & MASK64, (p0 >> 64) ^ c[3] ^ k[1], p0 & MASK64]
    return c


def draw_value(seed: int, k: int) -> np.float32:
    """Value k of the matrix stream, from first principles (CONTRACT §4)."""
    word = 2 * k
    block = philox4x64_10((word // 4 + 1, 0, 0, 0), (seed, 0))
    a, b = block[word % 4], block[word % 4 + 1]
    u1 = ((a >> 11) + 1) * 2.0 ** -53
    u2 = (b >> 11) * 2.0 ** -53
    return np.float32(0.02 * (math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)))


def stream_positions(profile):
    """[(parameter, first stream value index)] for the matrices, in parameter order."""
    out, k = [], 0
    for p in profile.parameters:
        if len(p.shape) > 1:
            out.append((p, k))
            k += p.size
    return out


def check_elements(profile, P: np.ndarray, picks_per_matrix: int, rng) -> int:
    """Compare first, last and random elements of every matrix with draw_value; bits must match."""
    n = 0
    for p, k0 in stream_positions(profile):
        local = np.concatenate([[0, p.size - 1], rng.integers(0, p.size, picks_per_matrix)])
        for j in local:
            want = draw_value(profile.seed, k0 + int(j))
            got = P[p.offset + int(j)]
            assert got.tobytes() == want.tobytes(), \
                f"{p.name} element {int(j)} (stream value {k0 + int(j)}): {got!r} != {want!r}"
            n += 1
    return n
