"""bf16 rounding against torch's float→bfloat16 conversion, and the rotary tables against torch."""
from __future__ import annotations

import numpy as np
import torch

from coppelius.plan import profiles
from coppelius.plan import reference as ref
from tests.support.paths import ROOT

SPECIALS = np.array([
    0x00000000, 0x80000000,             # ±0
    0x7F800000, 0xFF800000,             # ±inf
    0x7F7FFFFF, 0xFF7FFFFF,             # ±max finite: rounds up to ±inf
    0x7F7F7FFF, 0x7F7F8000,             # just below / at the overflow tie (tie → even → inf)
    0x00000001, 0x80000001,             # smallest subnormals
    0x00008000, 0x00018000,             # subnormal ties: to even down / up
    0x007FFFFF,                         # largest subnormal rounds to the smallest normal
    0x3F808000, 0x3F818000,             # 1 + 2⁻⁸ (tie → 1), 1 + 3·2⁻⁸ (tie → 1 + 2⁻⁶)
    0x3F808001, 0x3F807FFF,             # just above / below a tie
    0x3F800000, 0xBF800000,
], dtype=np.uint32)
NANS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F80FFFF, 0xFF800001, 0x7FFFFFFF,
                 0xFFFFFFFF], dtype=np.uint32)


def _torch_bf16(u: np.ndarray) -> np.ndarray:
    return torch.from_numpy(u.view(np.float32).copy()).to(torch.bfloat16).float().numpy()


def test_bf16_matches_torch_bit_for_bit():
    rng = np.random.default_rng(7)
    u = np.concatenate([SPECIALS, rng.integers(0, 2 ** 32, 1_000_003, dtype=np.uint32)])
    u = u[~np.isnan(u.view(np.float32))]
    got, want = ref.bf16(u.view(np.float32)).view(np.uint32), _torch_bf16(u).view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{bad.size} differ; first input {u[bad[0]]:#010x}: "
                           f"ours {got[bad[0]]:#010x} torch {want[bad[0]]:#010x}")


def test_bf16_nan_stays_nan_and_keeps_sign():
    out = ref.bf16(NANS.view(np.float32))
    assert np.isnan(out).all(), [hex(x) for x in out.view(np.uint32)]
    assert (np.signbit(out) == np.signbit(NANS.view(np.float32))).all()
    assert (out.view(np.uint32) & 0xFFFF).max() == 0


def test_bf16_shapes_views_and_idempotence():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((37, 11)).astype(np.float32)
    strided = x[::2, ::3]                               # non-contiguous input
    assert np.array_equal(ref.bf16(strided), ref.bf16(strided.copy()))
    assert ref.bf16(x).shape == x.shape and ref.bf16(x).dtype == np.float32
    assert np.array_equal(ref.bf16(ref.bf16(x)), ref.bf16(x))
    assert ref.bf16(np.float32(1.00390625)).shape == () and ref.bf16(1.00390625) == 1.0
    assert np.isnan(ref.bf16(np.float32("nan"))) and ref.bf16(np.float32("nan")).shape == ()
    before = x.copy()
    ref.bf16(x)
    assert np.array_equal(x, before), "bf16 modified its input"


def test_rotary_tables_match_torch_float64():
    for prof in (profiles.get("tiny"), profiles.get("coppelius")):
        cos, sin = ref.rotary_tables(prof)
        d, T = prof.head_dim, prof.context
        assert cos.shape == sin.shape == (T, d // 2) and cos.dtype == np.float32
        inv = torch.tensor([10000.0 ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv
        for name, ours, theirs in (("cos", cos, torch.cos(ang).float().numpy()),
                                   ("sin", sin, torch.sin(ang).float().numpy())):
            bad = np.argwhere(ours != theirs)
            assert bad.size == 0, f"{prof.name} {name}{tuple(bad[0])}: {ours[tuple(bad[0])]!r} " \
                                  f"!= {theirs[tuple(bad[0])]!r}"
        assert not cos.flags.writeable


def test_attention_scale():
    assert ref.attention_scale(64) == np.float32(0.125)
    assert ref.attention_scale(32) == np.float32(1 / np.sqrt(32.0))


def test_reference_imports_neither_torch_nor_triton():
    import subprocess
    import sys
    code = "import sys, coppelius.plan.reference; print(sorted({'torch', 'triton'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout
