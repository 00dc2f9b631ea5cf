"""The tolerances of the comparisons: verify's budgets, diff's and bisect's across-backends defaults,
and the one rule that turns what was asked into (atol, rtol).

`coppelius verify` compares a result with the numpy reference under MEAN_ATOL / ROW_ATOL /
LOGIT_ATOL; `coppelius diff --across-backends` compares two result files under RESULTS_ACROSS;
`coppelius bisect --across-backends` compares two digests files under DIGESTS_ACROSS.  `resolve`
is the rule both diff and bisect use: what was asked, else the defaults across backends, else exact.
"""
from __future__ import annotations

import math

from coppelius.staging.errors import UserError

# Per-step tolerances between a backend's losses and the reference (fp32 accumulation order and the
# bf16 rounding flips it causes differ between them).  Measured on the interpret backend, tiny
# profile: see docs/PERFORMANCE.md / the verify tests.
MEAN_ATOL = 2e-3        # |mean ce (result) - mean ce (reference)| per step
ROW_ATOL = 5e-2         # max over rows of |ce_row (result) - ce_row (reference)|
LOGIT_ATOL = 5e-2       # forward part: logits of the PREDICTION_ROWS rows before any step

# Result files, --across-backends.  cuda and interpret run the same kernel sources on the same bf16
# operands; they accumulate fp32 in different orders (mma/wgmma vs numpy's matmul), so a sum moves
# by a few fp32 ulps, which now and then flips the bf16 rounding of a later operand by one bf16 ulp,
# and training carries those flips on.  The same kind of difference separates a backend from the
# numpy reference, for which `coppelius verify` budgets 5e-2 per row of cross-entropy and per
# logit (ROW_ATOL = LOGIT_ATOL).  Measured, interpret vs the reference, tiny profile,
# `coppelius verify RESULT --steps 2`: forward logits max |Δ| 6.3e-4, per-row ce 7.1e-4 (step 0)
# and 6.9e-4 (step 1) — the budget is ≈ 70× that.  ATOL takes that budget; RTOL is one bf16 ulp
# relative (bf16 keeps 8 significant bits: an ulp is 2^-8 .. 2^-7 of the value), for large logits.
# Sized for short runs (tiny, a verify window): over thousands of steps two backends' trajectories
# drift apart further, and `--atol/--rtol` say how far is acceptable.  The absolute part is loose
# for the loss block's gradient and parameter windows (|x| ≪ 5e-2).
RESULTS_ACROSS_ATOL = ROW_ATOL
RESULTS_ACROSS_RTOL = 2.0 ** -7
RESULTS_ACROSS = (RESULTS_ACROSS_ATOL, RESULTS_ACROSS_RTOL)

# Digests files, --across-backends: one bf16 ulp (bf16 keeps 8 significant bits) of the element,
# and of the region's largest magnitude (a fp32 sum in another order moves a value by a few fp32
# ulps, which now and then flips a bf16 rounding by one bf16 ulp: tests/host/run/
# test_digests_interpret.py runs the interpreter with its dot products summed in another order
# against this).  The atol is relative to each region's largest |x| (host/forensics/bisect.py).
DIGESTS_ACROSS_ATOL = 2.0 ** -7
DIGESTS_ACROSS_RTOL = 2.0 ** -7
DIGESTS_ACROSS = (DIGESTS_ACROSS_ATOL, DIGESTS_ACROSS_RTOL)


def resolve(atol: float | None = None, rtol: float | None = None, across_backends: bool = False,
            across: tuple[float, float] = RESULTS_ACROSS) -> tuple[float, float]:
    """(atol, rtol): what was asked, else the `across` defaults (RESULTS_ACROSS for result files,
    DIGESTS_ACROSS for digests files) when comparing across backends, else 0 (the bits must match).

    Raises UserError for a negative or non-finite tolerance."""
    atol = atol if atol is not None else (across[0] if across_backends else 0.0)
    rtol = rtol if rtol is not None else (across[1] if across_backends else 0.0)
    if atol < 0 or rtol < 0 or not (math.isfinite(atol) and math.isfinite(rtol)):
        raise UserError(f"tolerances must be finite and ≥ 0 (got --atol {atol}, --rtol {rtol})",
                        "pass finite --atol/--rtol ≥ 0; 0 means the bits must match")
    return float(atol), float(rtol)


def tolerances(args, across: tuple[float, float] = RESULTS_ACROSS) -> tuple[float, float]:
    """`resolve` for parsed arguments (or any object) with .atol, .rtol and .across_backends."""
    return resolve(args.atol, args.rtol, args.across_backends, across)
