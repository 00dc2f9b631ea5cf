"""Helpers for the kernel tests: poisoned outputs, bf16 conversions, checks that name the element.

Triton's interpreter is set up by tests/conftest.py; the tolerances are tests/support/tolerances.py's.
"""
from __future__ import annotations

import numpy as np
import torch

from coppelius.plan import reference as ref


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    """A tensor whose every byte is 0xFF: NaN for floats, -1 for ints — unwritten elements show."""
    t = torch.empty(shape, dtype=dtype)
    t.view(torch.uint8).fill_(0xFF) if t.numel() else None
    return t


def bf16_bits(x) -> np.ndarray:
    """fp32 values → their bf16 bit patterns, round to nearest even (the reference's bf16)."""
    return (ref.bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits) -> np.ndarray:
    """bf16 bit patterns → the fp32 values they stand for (exact)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_tensor(x) -> torch.Tensor:
    """A bf16 tensor of the reference's rounding of x."""
    return torch.from_numpy(np.ascontiguousarray(bf16_bits(x)).view(np.int16)).view(torch.bfloat16)


def ssq_parts(x: np.ndarray, parts: int) -> np.ndarray:
    """(parts, M) per-row Σ x² of x (M, K) over `parts` column chunks: what a residual producer's
    column tiles write for the norm prologue that reads them."""
    bounds = np.linspace(0, x.shape[1], parts + 1).astype(int)
    return np.stack([(x[:, a:b] * x[:, a:b]).sum(1, dtype=np.float32)
                     for a, b in zip(bounds[:-1], bounds[1:])])


def f32(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


def assert_written(name: str, t: torch.Tensor) -> None:
    """No element still holds the poison: NaN for floats, -1 for ints (see `poisoned`)."""
    bad = torch.isnan(t.float()) if t.dtype.is_floating_point else (t == -1)
    if bad.any():
        where = np.argwhere(bad.numpy())[0]
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements never written, "
                             f"first at {tuple(int(i) for i in where)} of shape {tuple(t.shape)}")


def assert_unwritten(name: str, t: torch.Tensor) -> None:
    """Every element still holds the poison: the kernel wrote nothing past its bounds."""
    bad = ~torch.isnan(t.float()) if t.dtype.is_floating_point else (t != -1)
    if bad.any():
        where = np.argwhere(bad.numpy())[0]
        raise AssertionError(f"{name}: {int(bad.sum())} elements written past the bounds, first at "
                             f"{tuple(int(i) for i in where)}")


def assert_bitwise(name: str, got, want) -> None:
    """got == want element for element (NaN equals nothing); names the first mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    bad = got != want
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} elements differ, first at {i} "
                             f"(got {got[i].item()!r}, want {want[i].item()!r})")


def assert_close(name: str, got, want, rel: float) -> None:
    """max |got - want| ≤ rel · max|want|; prints the worst element and where it is."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want)
    scale = max(float(np.abs(want).max()), 1e-30)
    i = tuple(int(k) for k in np.unravel_index(int(np.argmax(err)), err.shape))
    print(f"{name}: worst |err| {err[i]:.3g} at {i} (got {got[i]:.8g}, want {want[i]:.8g}), "
          f"scale {scale:.3g}, limit {rel * scale:.3g}")
    finite = np.isfinite(got)
    if not finite.all():
        j = tuple(int(k) for k in np.argwhere(~finite)[0])
        raise AssertionError(f"{name}: {int((~finite).sum())} non-finite outputs, first at {j} "
                             f"(got {got[j]}, want {want[j]:.8g})")
    assert err[i] <= rel * scale, (f"{name}: |err| {err[i]:.3g} at {i} (got {got[i]:.8g}, want "
                                   f"{want[i]:.8g}) exceeds {rel} × {scale:.3g}")
