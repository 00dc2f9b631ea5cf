"""Environments that make this CPU compute as other CPUs would, for the interpret backend's
independence of the CPU (docs/NUMERICS.md, "CPU-side arithmetic").

What could make the interpreter's bits depend on the CPU is read from the environment when the
libraries load, so each environment is for a fresh subprocess: OPENBLAS_CORETYPE (the OpenBLAS
kernel family, one per CPU generation; a family whose instructions the CPU lacks would fault, so
only those it can execute), OPENBLAS_NUM_THREADS, and NPY_DISABLE_CPU_FEATURES (numpy's SIMD
dispatch targets above its baseline switched off: an AVX-512 CPU then runs numpy's AVX2 loops, an
AVX2 one its SSE4 ones).  `OLDEST` and `NEWEST` are the two ends, which the golden checks of
tests/host/run/test_run_interpret.py run under in every `make test`; `matrix()` is every family
this CPU executes, which tests/host/run/test_cpu_independence.py runs (`make test-cpu-matrix`).
"""
from __future__ import annotations

import os
from pathlib import Path

from numpy._core import _multiarray_umath as _npy_cpu

# OpenBLAS DYNAMIC_ARCH x86-64 families, oldest first, and the CPU flags each one's kernels need
# (OpenBLAS's cpuid_x86.c support checks, as /proc/cpuinfo names them: Linux calls SSE3 "pni")
CORETYPES = {
    "Prescott": {"pni"},
    "Nehalem": {"sse4_2"},
    "Sandybridge": {"avx"},
    "Haswell": {"avx2", "fma"},
    "Zen": {"avx2", "fma"},
    "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl"},
}
THREADS = ("1", "4")           # OPENBLAS_NUM_THREADS: one thread, and more threads than cores
VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "NPY_DISABLE_CPU_FEATURES")
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> frozenset:
    """The flags of the first CPU in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def coretypes() -> list[str]:
    """The OpenBLAS families this CPU executes, oldest first (none off x86-64)."""
    flags = cpu_flags()
    return [name for name, need in CORETYPES.items() if need <= flags]


def dispatch_targets() -> list[str]:
    """numpy's dispatch targets above its baseline that this CPU runs (e.g. X86_V3, X86_V4)."""
    features = _npy_cpu.__cpu_features__
    return [t for t in _npy_cpu.__cpu_dispatch__ if features.get(t)]


def _env(coretype: str | None, threads: str, disabled: list[str]) -> dict:
    env = {"OPENBLAS_NUM_THREADS": threads}
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    if disabled:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(disabled)
    return env


def oldest() -> dict:
    """The oldest family, one thread, numpy's dispatch off: this CPU as an SSE3-era one."""
    families = coretypes()
    return _env(families[0] if families else None, THREADS[0], dispatch_targets())


def newest() -> dict:
    """The newest family, four threads, numpy's highest dispatch target off where it has two."""
    families, targets = coretypes(), dispatch_targets()
    return _env(families[-1] if families else None, THREADS[1],
                targets[-1:] if len(targets) > 1 else [])


def matrix() -> list[tuple[str, dict]]:
    """Every family this CPU executes (threads alternating 1 and 4; numpy's dispatch off for the
    oldest), and numpy's highest target off alone where there are two; off x86-64, the thread
    counts and the dispatch alone."""
    families, targets = coretypes(), dispatch_targets()
    out = [(name, _env(name, THREADS[i % 2], targets if i == 0 else []))
           for i, name in enumerate(families)]
    if len(targets) > 1:
        out.append((f"no {targets[-1]}", _env(None, THREADS[1], targets[-1:])))
    if not families:
        out = [("threads 4", _env(None, THREADS[1], [])),
               ("no dispatch", _env(None, THREADS[0], targets))]
    return out


def environ(env: dict) -> dict:
    """os.environ with this module's variables replaced by `env`'s."""
    out = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    out.update(env)
    return out
