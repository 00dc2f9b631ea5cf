"""Integer arithmetic the plan, the tools and the tests share: one definition each."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for integers a and b > 0 (triton.cdiv, without importing Triton)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (n ≥ 1): a block that covers n elements."""
    return 1 << (n - 1).bit_length()
