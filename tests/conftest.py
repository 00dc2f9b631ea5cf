"""The test session's set-up: no terminal size from the caller, then Triton's interpreter.

Reports written to a pipe take at least WIDTH_PIPED columns unless COLUMNS says otherwise
(coppelius.cli.console), and the tests read their text: a COLUMNS in the caller's environment — a
shell that exports it, or pytest-xdist's workers, which set COLUMNS=80 and LINES=24 — would wrap
and cut what they look for.  The tests that are about COLUMNS set it themselves.

It imports coppelius.backends.interpret, which sets TRITON_INTERPRET=1 and repairs the
interpreter: both must happen before any coppelius.plan.kernels module is imported (its kernels are
decorated then), so no test module has to import it first.  No BLAS or CPU pin is needed: the
interpreter's arithmetic does not depend on the CPU (docs/NUMERICS.md, "CPU-side arithmetic";
tests/host/run/test_cpu_independence.py runs the golden under other OpenBLAS kernel families, thread
counts and numpy dispatch levels).
"""
import os
import sys
from pathlib import Path

for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import coppelius.backends.interpret  # noqa: E402,F401  (the interpreter, before any coppelius.plan.kernels import)
