"""What each kernel family does per program, for the cost model (tools/cost/): the registry,
keyed by the Triton function name, that the family modules fill — kernels_matmul.py (matmuls,
weight gradients), kernels_attention.py, kernels_rows.py (row kernels, streams, releases) — on
the vocabulary of work.py.  An entry reads a Launch (grid, arguments, constexprs) and returns its
Work.

To cost a new kernel: write `@family("name") def _name(v: View) -> Work` in its family's module;
the model refuses a launch whose function has no entry, whose programs disagree with its grid, or
whose staging arguments the entry does not account for.
"""
from __future__ import annotations

from tools.cost import kernels_attention, kernels_matmul, kernels_rows  # noqa: F401  (they register)
from tools.cost.work import REGISTRY

__all__ = ["REGISTRY"]
