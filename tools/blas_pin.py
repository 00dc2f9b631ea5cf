"""The OpenBLAS kernel family the interpret golden was made with, pinned where the CPU has it.

The interpret backend's tl.dot is numpy's matmul, i.e. OpenBLAS sgemm, whose summation order
depends on the kernel family OpenBLAS picks at load (DYNAMIC_ARCH): the committed golden
(tests/golden/) is SkylakeX's bits, and an AVX-512 AMD EPYC picks Haswell by default and differs
from it in the last bit of 878 forward logits (tools/make_golden.py --check, 2026-12-01).  Pinning
the family where the CPU supports it makes the golden reproducible on every AVX-512 x86-64
machine (over a family the environment names: only the golden's reproduces it); elsewhere nothing is pinned (forcing it would fault) and the golden may differ in the
last bits, which `coppelius diff` names.  OPENBLAS_CORETYPE is read when OpenBLAS loads: set it
before numpy is imported, or in the environment of a subprocess.
"""
from __future__ import annotations

import os
from pathlib import Path

GOLDEN_CORETYPE = "SkylakeX"
# the instruction sets OpenBLAS's SkylakeX kernels use (its cpuid_x86.c support check)
GOLDEN_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> frozenset:
    """The flags of the first CPU in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def pin(environ=os.environ) -> str | None:
    """Set OPENBLAS_CORETYPE in `environ` to the golden's family when the CPU supports it, over
    any family set before (a machine may set one for all its jobs: this development machine sets
    Haswell); returns the value in effect (None: nothing set)."""
    if GOLDEN_CPU_FLAGS <= cpu_flags():
        environ["OPENBLAS_CORETYPE"] = GOLDEN_CORETYPE
    return environ.get("OPENBLAS_CORETYPE")
