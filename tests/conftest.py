"""The test session's set-up: no terminal size from the caller, the BLAS kernel family the
interpret golden was made with, then Triton's interpreter.

Reports written to a pipe take at least WIDTH_PIPED columns unless COLUMNS says otherwise
(coppelius.cli.console), and the tests read their text: a COLUMNS in the caller's environment — a
shell that exports it, or pytest-xdist's workers, which set COLUMNS=80 and LINES=24 — would wrap
and cut what they look for.  The tests that are about COLUMNS set it themselves.

It runs before any test module imports numpy, so the in-process interpreter tests and every
subprocess a test starts (they inherit the environment) use the same sgemm summation order as
tests/golden/ (tools/blas_pin.py says why).  Then it imports coppelius.backends.interpret, which sets
TRITON_INTERPRET=1 and repairs the interpreter: both must happen before any coppelius.plan.kernels module
is imported (its kernels are decorated then), so no test module has to import it first.
"""
import os
import sys
from pathlib import Path

for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

ROOT = Path(__file__).resolve().parents[1]
if "numpy" in sys.modules:          # too late to pin: OpenBLAS has loaded; say so, do not guess
    print("conftest: numpy was imported before the BLAS pin; golden bits may differ",
          file=sys.stderr)
sys.path.insert(0, str(ROOT))
from tools.blas_pin import pin  # noqa: E402

pin()
import coppelius.backends.interpret  # noqa: E402,F401  (the interpreter, before any coppelius.plan.kernels import)
