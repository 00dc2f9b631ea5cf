"""The interpret backend's bits do not depend on the CPU: the tiny golden run, 8 steps, reproduced
bit for bit in subprocesses that compute as other CPUs would (tests/support/cpu_environments.py):
every OpenBLAS family this CPU executes, OPENBLAS_NUM_THREADS 1 and 4, numpy's SIMD dispatch
switched off.  Each run's result file must equal tests/golden/tiny-result-c0.bin but for the time
and environment fields (`coppelius diff` exit 0).  Before the interpreter's arithmetic was fixed
(host/backends/interpreter_repairs.py) this failed on the AMD EPYC that wrote it: numpy's AVX2 exp
and the BLAS families gave other bits in the first attention launch.

The two ends of the matrix run in every `make test` (the golden checks of
tests/host/run/test_run_interpret.py run under them); the whole matrix, a run of ~3 minutes per
family here, is `make test-cpu-matrix` (marker `cpu_matrix`), which CI runs after `make test`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cpu_environments as cpu
from tests.support.paths import GOLDEN, ROOT

MATRIX = cpu.matrix()


def run_tiny(directory: Path, env: dict, *extra) -> subprocess.CompletedProcess:
    """The tiny embedded default on the interpret backend, under `env` (cpu_environments)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny.ckpt").write_bytes(b"")
    return subprocess.run(
        [sys.executable, "-m", "coppelius.cli", "run", "--profile", "tiny", "--backend",
         "interpret", "--quiet", "--directory", directory / "run", "--checkpoint",
         directory / "tiny.ckpt", "--result", directory / "result.bin", *map(str, extra)],
        capture_output=True, text=True, cwd=ROOT, env=cpu.environ(env), timeout=1800)


def test_the_matrix_covers_this_cpu():
    """Every family this x86-64 CPU can execute, and numpy's dispatch off where it has any; the
    two ends `make test` runs are the matrix's first and last families."""
    names = [name for name, _ in MATRIX]
    assert names
    assert names[:len(cpu.coretypes())] == cpu.coretypes()
    if cpu.dispatch_targets():
        assert any("NPY_DISABLE_CPU_FEATURES" in env for _, env in MATRIX)
    if cpu.coretypes():
        assert cpu.oldest()["OPENBLAS_CORETYPE"] == cpu.coretypes()[0]
        assert cpu.newest()["OPENBLAS_CORETYPE"] == cpu.coretypes()[-1]
    if "pni" in cpu.cpu_flags():                  # SSE3, as Linux names it
        assert "Prescott" in names


@pytest.mark.cpu_matrix
@pytest.mark.parametrize("label, env", MATRIX, ids=[label for label, _ in MATRIX])
def test_the_golden_run_is_the_same_bits_under(label, env, tmp_path):
    r = run_tiny(tmp_path, env, "--steps", 8)
    assert r.returncode == 0, f"{env}: the run failed:\n{r.stderr[-3000:]}"
    d = subprocess.run([sys.executable, "-m", "coppelius.cli", "diff",
                        GOLDEN / "tiny-result-c0.bin", tmp_path / "result.bin"],
                       capture_output=True, text=True, cwd=ROOT)
    assert d.returncode == 0, (f"under {env} the tiny run's bits differ from the golden:\n"
                               + d.stdout[-3000:] + d.stderr[-1000:])
