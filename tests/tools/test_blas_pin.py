"""The BLAS pin the golden needs (tools/blas_pin.py): set only where the CPU has the family, never
over the user's choice, and in effect in this test session."""
import os

from tools import blas_pin


def test_pins_the_golden_family_where_the_cpu_has_it(monkeypatch):
    monkeypatch.setattr(blas_pin, "cpu_flags", lambda: blas_pin.GOLDEN_CPU_FLAGS | {"sse2"})
    env = {}
    assert blas_pin.pin(env) == blas_pin.GOLDEN_CORETYPE == env["OPENBLAS_CORETYPE"]


def test_leaves_a_cpu_without_it_alone_and_overrides_a_machine_wide_family(monkeypatch):
    monkeypatch.setattr(blas_pin, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert blas_pin.pin({}) is None
    assert blas_pin.pin({"OPENBLAS_CORETYPE": "Haswell"}) == "Haswell"     # would fault: kept
    monkeypatch.setattr(blas_pin, "cpu_flags", lambda: blas_pin.GOLDEN_CPU_FLAGS)
    assert blas_pin.pin({"OPENBLAS_CORETYPE": "Haswell"}) == blas_pin.GOLDEN_CORETYPE


def test_the_session_runs_pinned_where_the_cpu_allows():
    if blas_pin.GOLDEN_CPU_FLAGS <= blas_pin.cpu_flags():
        assert os.environ.get("OPENBLAS_CORETYPE") == blas_pin.GOLDEN_CORETYPE
