"""Helpers for the kernel tests (issue #7): interpreter setup, poisoned outputs, named tolerances.

Importing this imports host.backend_interpret first, which sets TRITON_INTERPRET=1 and repairs the
interpreter before any plan.kernels module is decorated.
"""
from __future__ import annotations

import host.backend_interpret as backend_interpret  # noqa: F401  (must precede plan.kernels)
import numpy as np
import torch

from plan import reference as ref
from plan.launch_types import cdiv, next_pow2  # noqa: F401  (re-exported for the kernel tests)

# Named tolerances, relative to the largest magnitude of the expected array.
SAME_OPERANDS = 2e-6        # same bf16 operands, fp32 accumulation in another order
ONE_BF16_ULP = 2.0 ** -7    # a bf16 output may round the other way when its fp32 value sits on a tie
ELEMENTWISE = 1e-6          # fp32 elementwise math (exp/log/div differ by an ulp or two)


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    """A tensor whose every byte is 0xFF: NaN for floats, -1 for ints — unwritten elements show."""
    t = torch.empty(shape, dtype=dtype)
    t.view(torch.uint8).fill_(0xFF) if t.numel() else None
    return t


def bf16_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(ref.bf16(np.asarray(x, np.float32))).to(torch.bfloat16)


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
