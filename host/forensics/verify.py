"""A result file's first steps recomputed with the numpy reference model and compared: `verify`.

The forward logits of the PREDICTION_ROWS rows (before any step) against LOGIT_ATOL, then each
step's per-row losses: the mean against `mean_atol`, the worst row against `row_atol`
(coppelius.forensics.tolerances).  A run that continued (c0 > 0) starts from its input checkpoint,
which must hold update c0 and the payload the result's stat record names.  The command line
(`coppelius verify`) renders the report as a table.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from coppelius.plan.profiles import PREDICTION_ROWS
from coppelius.staging.errors import UserError
from coppelius.staging.synthetic import DEFAULT_DIRECTORY

from coppelius.forensics.tolerances import LOGIT_ATOL, MEAN_ATOL, ROW_ATOL


def verify(result, tokens=None, steps: int = 2, checkpoint=None, mean_atol: float = MEAN_ATOL,
           row_atol: float = ROW_ATOL, directory=DEFAULT_DIRECTORY) -> dict:
    """Recompute the first `steps` steps of result file `result` and compare.

    `tokens`: the token cache the run used (default: the profile's embedded stream, made or found
    in `directory`); `checkpoint`: the run's input checkpoint, needed when c0 > 0.  Returns
    {"path", "profile", "c0", "steps", "forward": {...}, "losses": [{...} per step], "ok"}; each
    part has "ok" and the numbers compared.  Refusals (UserError) name what is missing or wrong."""
    from coppelius.plan import reference
    from coppelius.results.reader import read
    from coppelius.staging.tokens import TokenCache

    rf = read(result)
    profile = rf.profile
    c0 = int(rf.status["c0"])
    n = min(steps, int(rf.status["steps_completed"]))
    if steps < 1:
        raise UserError(f"--steps {steps} must be at least 1", "pass --steps 1 or more")
    if tokens is None:
        from coppelius.staging import synthetic
        tokens = synthetic.ensure_default_stream(profile, Path(directory))
    cache = TokenCache.open(tokens, profile)
    cache.validate_run(c0, max(n, 1))
    P, M, V = starting_state(rf, checkpoint)

    inputs, _targets = cache.context(c0)
    forward = _forward(reference.forward(profile, P, np.asarray(inputs)), np.asarray(rf.forward))
    losses = []
    for s in range(n):
        inputs, targets = cache.context(c0 + s)
        ce, _grad, P, M, V = reference.update_submission(profile, P, M, V, c0 + s + 1,
                                                         np.asarray(inputs), np.asarray(targets))
        losses.append(_losses(s, np.asarray(rf.losses[s]), ce, mean_atol, row_atol))
    return {"path": str(result), "profile": profile.name, "c0": c0, "steps": n,
            "forward": forward, "losses": losses,
            "ok": forward["ok"] and all(x["ok"] for x in losses)}


def _forward(logits: np.ndarray, got: np.ndarray) -> dict:
    """The result's forward logits against the reference's, rows PREDICTION_ROWS."""
    rows = np.asarray(PREDICTION_ROWS)
    want = logits[rows]
    diff = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(int(np.nanargmax(diff)) if np.isfinite(diff).any() else 0, diff.shape)
    return {"row": int(rows[worst[0]]), "col": int(worst[1]), "result": float(got[worst]),
            "reference": float(want[worst]), "max_abs": float(diff.max()), "atol": LOGIT_ATOL,
            "ok": bool(np.isfinite(got).all() and diff.max() <= LOGIT_ATOL)}


def _losses(step: int, got: np.ndarray, ce: np.ndarray, mean_atol: float, row_atol: float) -> dict:
    """One step's per-row losses against the reference's."""
    d = np.abs(got.astype(np.float64) - ce)
    mean_d = abs(float(got.mean(dtype=np.float64)) - float(ce.mean(dtype=np.float64)))
    r = int(np.nanargmax(d)) if np.isfinite(d).any() else 0
    return {"step": step, "result_mean": float(got.mean(dtype=np.float64)),
            "reference_mean": float(ce.mean(dtype=np.float64)), "mean_abs": mean_d,
            "worst_row": r, "row_max_abs": float(d.max()), "mean_atol": mean_atol,
            "row_atol": row_atol,
            "ok": bool(np.isfinite(got).all() and mean_d <= mean_atol and d.max() <= row_atol)}


def starting_state(rf, checkpoint=None):
    """(P, M, V) the run of ResultFile `rf` started from: fresh initialization at c0 = 0, else the
    run's input `checkpoint`, which must hold update c0 and the payload the stat record names."""
    from coppelius import checkpoints as ckpt
    from coppelius.plan import reference

    profile = rf.profile
    c0 = int(rf.status["c0"])
    if c0 == 0:
        P = reference.init_parameters(profile)
        return P, np.zeros_like(P), np.zeros_like(P)
    if checkpoint is None:
        raise UserError(f"{rf.path} continued from update {c0}",
                        "pass --checkpoint with the run's input checkpoint")
    update_count, P, M, V = ckpt.load(checkpoint, profile)
    if update_count != c0:
        raise UserError(f"checkpoint {checkpoint} holds update {update_count}, "
                        f"the result started at {c0}", "pass the run's input checkpoint")
    digest = hashlib.sha256()
    for plane in (P, M, V):
        digest.update(memoryview(plane).cast("B"))
    if digest.digest() != bytes(rf.stat["payload_sha256"]):
        raise UserError(f"checkpoint {checkpoint} is not the payload the run loaded "
                        "(payload SHA-256 differs from the stat record)",
                        "pass the run's input checkpoint")
    return P, M, V
