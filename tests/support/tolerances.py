"""Every named tolerance of the kernel, interpreter and production-size tests, defined once.

Each is relative to the largest magnitude of the expected array: |got − want| ≤ rel · max|want|
(kernels_support.assert_close; the production launches take the max over every region the sampled
programs own).  EXACT is bit for bit.  Where a value was measured, the comment says the worst seen.
"""
from __future__ import annotations

EXACT = 0.0
SAME_OPERANDS = 2e-6        # same bf16 operands, fp32 accumulation in another order
ONE_BF16_ULP = 2.0 ** -7    # a bf16 output may round the other way when its fp32 value sits on a tie
ELEMENTWISE = 1e-6          # fp32 elementwise math (exp/log/div differ by an ulp or two)

# Flash attention rounds bf(exp(s − m)) before normalizing (NUMERICS.md): ≤ 1 bf16 ulp of p.
ATTENTION_OUT = ONE_BF16_ULP / 2         # measured worst 1.9e-3 of max|o|
# The backward recomputes p in fp32 from lse and rounds ds and p to bf16 like the reference;
# the remaining differences are lse's last bits and summation order.
ATTENTION_GRAD = 1e-3                    # measured worst 1.4e-4 of max|grad|
# The backward stores bf(rotary_backward(dq')) etc.: the fp32 difference above, then bf16 rounding
# that may go the other way: one bf16 ulp of the largest element, plus ATTENTION_GRAD.
ATTENTION_GRAD16 = ONE_BF16_ULP + ATTENTION_GRAD
LSE = 1e-5                  # lse against float64 log-sum-exp of the same bf16 scores

GAIN_SUM = 1e-5             # dg = Σ over the rows in blocks of GAIN_ROWS vs numpy's pairwise sum
SWIGLU_Z16 = 2 * ONE_BF16_ULP   # z = bf(silu(a)·b) with a, b one bf16 ulp apart at most
MLP_DH = 4 * ONE_BF16_ULP   # dh = [da | db] @ [Wg; Wu] from the stored bf16 da, db (one ulp each)
DELTA_OF_STORED_DO = 1e-6   # delta = Σ_d dO·o from the kernel's own dO: sums in another order
DELTA_SUM = 1e-5            # delta from the oracle's dO (SAME_OPERANDS away), 64-term sums

# The AdamW kernels follow NUMERICS op by op with IEEE div/sqrt: the interpreter (numpy, no FMA)
# matches the reference to the last bit except where β^t by squaring differs from pow in fp64's
# last bit.
ADAMW_REL = 1e-6
ADAMW_ON_KERNEL_GRAD = 1e-6     # AdamW applied to the whole model's own gradient (tiny profile)

# The tiny profile's whole launch lists against the reference model (test_plan_interpret.py)
LOGITS = 2e-3               # whole-model logits, of max|logit| (measured 1.7e-4)
LOSS_ROWS = 1e-4            # per-row ce, of max ce (measured 6e-5)
GRADIENT = 1e-2             # per-parameter gradient, of its max (measured 3e-3)

# One production-size reference update_submission (test_reference_production.py), absolute in nats:
LOSS_NEAR_LN_V = 0.25       # |mean ce − ln V| at init: logits ~ N(0, 0.45²) add ≈ 0.1 nats
