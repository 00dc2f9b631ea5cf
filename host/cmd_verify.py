"""`coppelius verify`: recompute a result file's first steps with the numpy reference and compare."""
from __future__ import annotations

from pathlib import Path

from plan.profiles import PREDICTION_ROWS
from staging.synthetic import DEFAULT_DIRECTORY

ORDER = 40

# Per-step tolerances between a backend's losses and the reference (fp32 accumulation order and the
# bf16 rounding flips it causes differ between them).  Measured on the interpret backend, tiny
# profile: see docs/PERFORMANCE.md / the verify tests.
MEAN_ATOL = 2e-3        # |mean ce (result) - mean ce (reference)| per step
ROW_ATOL = 5e-2         # max over rows of |ce_row (result) - ce_row (reference)|
LOGIT_ATOL = 5e-2       # forward part: logits of the PREDICTION_ROWS rows before any step


def register(sub) -> None:
    p = sub.add_parser("verify", help="recompute the first steps on the CPU and compare the losses",
                       description="Recompute the first N steps of a result file with the numpy "
                       "reference model and compare the forward logits and per-row losses.")
    p.add_argument("result", type=Path)
    p.add_argument("--tokens", type=Path, help="the token cache the run used "
                   "(default: the embedded stream of the result's profile)")
    p.add_argument("--steps", type=int, default=2, help="steps to recompute (default 2)")
    p.add_argument("--checkpoint", type=Path, help="the run's input checkpoint (needed when the "
                   "run continued, c0 > 0; must match the payload digest in the stat record)")
    p.add_argument("--mean-atol", type=float, default=MEAN_ATOL)
    p.add_argument("--row-atol", type=float, default=ROW_ATOL)
    p.add_argument("--directory", type=Path, default=Path(DEFAULT_DIRECTORY),
                   help=f"where the embedded stream is cached (default ./{DEFAULT_DIRECTORY})")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np
    from .console import report_console, styled
    from rich.table import Table

    from plan import reference
    from staging.tokens import TokenCache

    from .errors import UserError
    from .result_reader import read

    console = report_console()
    rf = read(args.result)
    profile = rf.profile
    status = rf.status
    c0 = int(status["c0"])
    n = min(args.steps, int(status["steps_completed"]))
    if args.steps < 1:
        raise UserError(f"--steps {args.steps} must be at least 1", "pass --steps 1 or more")
    if args.tokens is None:
        from staging import synthetic
        tokens = synthetic.ensure_default_stream(profile, args.directory)
    else:
        tokens = args.tokens
    cache = TokenCache.open(tokens, profile)
    cache.validate_run(c0, max(n, 1))

    P, M, V = _starting_state(args, rf, c0)

    table = Table(title=f"verify {args.result} ({profile.name}, c0={c0}, {n} steps)")
    for col in ("what", "result", "reference", "max |Δ|", "tolerance", "verdict"):
        table.add_column(col)
    ok = True

    inputs, targets = cache.context(c0)
    logits = reference.forward(profile, P, np.asarray(inputs))
    rows = np.asarray(PREDICTION_ROWS)
    want = logits[rows]
    got = np.asarray(rf.forward)
    diff = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(int(np.nanargmax(diff)) if np.isfinite(diff).any() else 0, diff.shape)
    good = bool(np.isfinite(got).all() and diff.max() <= LOGIT_ATOL)
    ok &= good
    table.add_row("forward logits", f"row {rows[worst[0]]} col {worst[1]}: {got[worst]:.5f}",
                  f"{want[worst]:.5f}", f"{diff.max():.2e}", f"{LOGIT_ATOL:.0e}",
                  "ok" if good else styled(("differs", "red")))
    for s in range(n):
        inputs, targets = cache.context(c0 + s)
        ce, _grad, P, M, V = reference.update_submission(profile, P, M, V, c0 + s + 1,
                                                  np.asarray(inputs), np.asarray(targets))
        got = np.asarray(rf.losses[s])
        d = np.abs(got.astype(np.float64) - ce)
        mean_d = abs(float(got.mean(dtype=np.float64)) - float(ce.mean(dtype=np.float64)))
        r = int(np.nanargmax(d)) if np.isfinite(d).any() else 0
        good = bool(np.isfinite(got).all() and mean_d <= args.mean_atol and d.max() <= args.row_atol)
        ok &= good
        table.add_row(f"step {s} loss", f"{got.mean(dtype=np.float64):.6f}",
                      f"{ce.mean(dtype=np.float64):.6f}",
                      f"mean {mean_d:.1e}, row {r} {d.max():.1e}",
                      f"{args.mean_atol:.0e} / {args.row_atol:.0e}",
                      "ok" if good else styled(("differs", "red")))
    console.print(table)
    console.print("verified" if ok else styled(("verification failed", "red")))
    return 0 if ok else 1


def _starting_state(args, rf, c0: int):
    """(P, M, V) the run started from: fresh initialization at c0 = 0, else the run's input
    checkpoint, which must hold update c0 and the payload the stat record names."""
    import hashlib

    import numpy as np

    from plan import reference

    from . import checkpoint as ckpt
    from .errors import UserError

    profile = rf.profile
    if c0 == 0:
        P = reference.init_parameters(profile)
        return P, np.zeros_like(P), np.zeros_like(P)
    if args.checkpoint is None:
        raise UserError(f"{args.result} continued from update {c0}",
                        "pass --checkpoint with the run's input checkpoint")
    update_count, P, M, V = ckpt.load(args.checkpoint, profile)
    if update_count != c0:
        raise UserError(f"checkpoint {args.checkpoint} holds update {update_count}, "
                        f"the result started at {c0}", "pass the run's input checkpoint")
    digest = hashlib.sha256()
    for plane in (P, M, V):
        digest.update(memoryview(plane).cast("B"))
    if digest.digest() != bytes(rf.stat["payload_sha256"]):
        raise UserError(f"checkpoint {args.checkpoint} is not the payload the run loaded "
                        "(payload SHA-256 differs from the stat record)",
                        "pass the run's input checkpoint")
    return P, M, V
