"""`coppelius diff A B [C ...]`: where result files differ — the regression check, pair or fleet.

Two files: section by section, the first difference (section, step, row), max abs/rel differences
per section, and whether they are bit-identical.  More files: the classes of identical results, one
row per class (CONTRACT §13), each file tested against each class's first member in argument order.

`--across-backends` compares the numbers (forward and final logits, per-row losses, loss block,
predictions) under tolerances and lists the fields that name the backend and device apart.

Exit 0 when the files are the same (one class), 1 when they differ, 2 when one is unreadable.

This module is the subcommand (arguments, tolerances, exit code, JSON); the comparison is
`host.diff` (one section at a time in `host.diff_sections`), the classes `host.fleet`, the text
reports `host.diff_render`.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from .diff import ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL
from .errors import UserError
from .fleet import classify

ORDER = 30
EXIT_SAME, EXIT_DIFFERENT = 0, 1


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare result files: bit-identical, where they differ, or "
                       "the classes of a fleet",
                       description="Compare result files section by section. Time-dependent "
                       "fields (timestamps, wall times, stat times) and environment fields "
                       "(checkpoint inode and device, driver version) are reported apart and never "
                       "make files different. With more than two files: the classes of identical "
                       "results, each file tested against each class's first member in argument "
                       "order. Exit 0 same (one class), 1 different, 2 unreadable.")
    p.add_argument("a", metavar="A", help="first result file (the reference of class 1)")
    p.add_argument("b", metavar="B", help="second result file")
    p.add_argument("more", metavar="C", nargs="*", help="more result files: a fleet")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for numeric sections (default 0: bits must match; "
                   f"with --across-backends {ACROSS_BACKENDS_ATOL:g})")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for numeric sections (default 0: bits must match; "
                   f"with --across-backends {ACROSS_BACKENDS_RTOL:g}, one bf16 ulp)")
    p.add_argument("--across-backends", action="store_true",
                   help="compare the numbers under the tolerances; backend, device, compute "
                   "capability, driver, PTX target and checkpoint digests are listed side by side "
                   "and never count")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def tolerances(args, across: tuple[float, float] = (ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL)
               ) -> tuple[float, float]:
    """(atol, rtol): what was asked, else the --across-backends defaults (`across`: diff's, or
    bisect's), else exact."""
    atol = args.atol if args.atol is not None else (across[0] if args.across_backends else 0.0)
    rtol = args.rtol if args.rtol is not None else (across[1] if args.across_backends else 0.0)
    if atol < 0 or rtol < 0 or not np.isfinite([atol, rtol]).all():
        raise UserError(f"tolerances must be finite and ≥ 0 (got --atol {atol}, --rtol {rtol})",
                        "pass finite --atol/--rtol ≥ 0; 0 means the bits must match")
    return atol, rtol


def run(args) -> int:
    # deferred: rich loads only for a text report, and every `coppelius` start imports this module
    from .diff_render import render, render_fleet
    atol, rtol = tolerances(args)
    paths = [args.a, args.b, *args.more]
    fleet = classify(paths, atol, rtol, args.across_backends)
    if len(paths) == 2:                      # the two-file report, with the classes beside it
        report, show = dict(fleet["reports"][1], classes=fleet["classes"]), render
    else:
        del fleet["reports"]
        report, show = fleet, render_fleet
    if args.json:
        _dump(report)
    else:
        show(report)
    return EXIT_SAME if report["same"] else EXIT_DIFFERENT


def _dump(obj) -> None:
    json.dump(_finite(obj), sys.stdout, allow_nan=False)
    sys.stdout.write("\n")


def _finite(x):
    """JSON has no NaN or infinity: they become null."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x
