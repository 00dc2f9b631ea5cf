"""What each kernel family does per program, for the cost model (tools/cost_model.py): the registry,
keyed by the Triton function name, that the family modules fill — cost_kernels_matmul.py (matmuls,
weight gradients), cost_kernels_attention.py, cost_kernels_rows.py (row kernels, streams,
releases) — on the vocabulary of cost_work.py.  An entry reads a Launch (grid, arguments,
constexprs) and returns its Work.

To cost a new kernel: write `@family("name") def _name(v: View) -> Work` in its family's module;
the model refuses a launch whose function has no entry, whose programs disagree with its grid, or
whose staging arguments the entry does not account for.
"""
from __future__ import annotations

import sys
from pathlib import Path

for _p in (Path(__file__).resolve().parent.parent, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import cost_kernels_attention  # noqa: E402,F401  (each module registers its families)
import cost_kernels_matmul  # noqa: E402,F401
import cost_kernels_rows  # noqa: E402,F401
from cost_work import REGISTRY, Programs, Staging, Step, View, Work, cdiv, lines  # noqa: E402,F401
