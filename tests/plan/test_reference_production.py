"""One production-size reference update_submission on the CPU: time, loss at initialization,
update bounds."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from tests.support.init_stream import check_elements
from tests.support.tolerances import LOSS_NEAR_LN_V

from coppelius.plan import profiles
from coppelius.plan import reference as ref

PROD = profiles.get("coppelius")
STEP_BUDGET_S = 120.0           # one production step's bound; measured ≈ 10 s on the 2-core CI machine


@pytest.mark.slow
def test_production_update_submission():
    t0 = time.perf_counter()
    P = ref.init_parameters(PROD)
    t_init = time.perf_counter() - t0
    assert check_elements(PROD, P, 3, np.random.default_rng(1)) == 7 * PROD.layers * 5 + 2 * 5
    toks = np.random.default_rng(2).integers(0, PROD.vocab, PROD.context + 1).astype(np.uint32)
    M = np.zeros_like(P)
    V = np.zeros_like(P)
    t0 = time.perf_counter()
    ce, G, P1, M1, V1 = ref.update_submission(PROD, P, M, V, 1, toks[:-1], toks[1:])
    t_step = time.perf_counter() - t0
    loss = float(ce.mean())
    print(f"production: init {t_init:.1f} s, update_submission {t_step:.1f} s, loss {loss:.4f} "
          f"(ln V = {math.log(PROD.vocab):.4f})")
    assert t_step < STEP_BUDGET_S, f"update_submission took {t_step:.0f} s"
    assert ce.shape == (PROD.context,) and np.isfinite(ce).all()
    assert abs(loss - math.log(PROD.vocab)) < LOSS_NEAR_LN_V, loss
    assert np.isfinite(G).all()
    # first update from zero moments: m = (1−β1)g, v = (1−β2)g·g exactly, and every non-zero
    # gradient moves its parameter by lr after the decay (step_size·m/(√v/√bc2) = lr·sign g)
    c = ref.adamw_constants(PROD, 1)
    assert M1.tobytes() == (G * c["one_minus_beta1"]).tobytes()
    assert V1.tobytes() == (G * c["one_minus_beta2"] * G).tobytes()
    mask = ref.decay_mask(PROD)
    decayed = np.where(mask, P * c["decay"], P)
    step = np.abs(decayed.astype(np.float64) - P1)
    big = np.abs(G) > 1e-4                          # eps/|g| ≤ 1e-4 of the step
    lr = float(c["step_size"] * c["one_minus_beta1"])
    worst = float(np.abs(step[big] - lr).max())
    assert worst < 1e-3 * lr, f"a parameter moved {worst:.3g} away from lr = {lr:.3g}"
    assert (step[G == 0] == 0).all()
