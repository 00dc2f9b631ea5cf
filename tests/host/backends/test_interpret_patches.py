"""The interpret backend's changes to Triton's interpreter that are about speed, not bits."""
import torch
import triton
import triton.language as tl

import coppelius.backends.interpret  # noqa: F401  (sets TRITON_INTERPRET=1 and installs the changes)
from triton.runtime import interpreter as _interp

CALLS = 10          # device-function calls per program
PROGRAMS = 3


@triton.jit
def _plus_one(x):
    return x + 1


@triton.jit
def _calls_a_device_function(out_ptr, N: tl.constexpr, CALLS: tl.constexpr):
    offs_n = tl.arange(0, N)
    acc = tl.zeros((N,), tl.float32)
    for _ in range(CALLS):
        acc = _plus_one(acc)
    tl.store(out_ptr + tl.program_id(0) * N + offs_n, acc)


def test_device_function_calls_inside_a_launch_do_not_patch_triton_language_again(monkeypatch):
    """Triton patches triton.language at each device-function call (4 module scans each); inside
    a launch that has patched them already the backend skips it: a launch of 3 programs × 10
    calls patches for the launch and once for tl.core at the most, not 30 more times."""
    scans = []
    real = _interp._patch_builtin
    monkeypatch.setattr(_interp, "_patch_builtin", lambda *a: (scans.append(a[0]), real(*a))[1])
    out = torch.full((PROGRAMS * 16,), -1.0)
    _calls_a_device_function[(PROGRAMS,)](out, N=16, CALLS=CALLS)
    assert out.tolist() == [float(CALLS)] * (PROGRAMS * 16)
    # one patch scans at most 6 modules and classes (tl, tl.tensor, tl.math, tl.core,
    # tl.core.tensor, tensor_descriptor_base): the launch's own and one for tl.core at the most
    # (7 when this test runs alone, 10 after other launches; 142 without the change)
    assert len(scans) <= 2 * 6, f"{len(scans)} module scans for one launch"
