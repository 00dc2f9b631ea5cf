"""`coppelius diff A B [C ...]`: where result files differ — the regression check, pair or fleet.

Two files: section by section, the first difference (section, step, row), max abs/rel differences
per section, and whether they are bit-identical.  More files: the classes of identical results, one
row per class (CONTRACT §13), each file tested against each class's first member in argument order.

`--across-backends` compares the numbers (forward and final logits, per-row losses, loss block,
predictions) under tolerances and lists the fields that name the backend and device apart.

Exit 0 when the files are the same (one class), 1 when they differ, 2 when one is unreadable.

This module is the subcommand (arguments, exit code, JSON); the comparison is
`coppelius.forensics.compare_results` / `classify_results` (`coppelius.forensics.diff`, one section
at a time in `coppelius.forensics.sections`; the classes `coppelius.forensics.fleet`; the
tolerances `coppelius.forensics.tolerances`), the text reports `coppelius.cli.render_diff`.
"""
from __future__ import annotations

from coppelius.forensics.api import classify_results, compare_results, dumps
from coppelius.forensics.tolerances import RESULTS_ACROSS_ATOL, RESULTS_ACROSS_RTOL

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
                   f"with --across-backends {RESULTS_ACROSS_ATOL:g})")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for numeric sections (default 0: bits must match; "
                   f"with --across-backends {RESULTS_ACROSS_RTOL:g}, one bf16 ulp)")
    p.add_argument("--across-backends", action="store_true",
                   help="compare the numbers under the tolerances; backend, device, compute "
                   "capability, driver, PTX target and checkpoint digests are listed side by side "
                   "and never count")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    # deferred: rich loads only for a text report, and every `coppelius` start imports this module
    from coppelius.cli.render_diff import render, render_fleet
    paths = [args.a, args.b, *args.more]
    if len(paths) == 2:                      # the two-file report, with the classes beside it
        report = compare_results(args.a, args.b, args.atol, args.rtol, args.across_backends)
        show = render
    else:
        report = classify_results(paths, args.atol, args.rtol, args.across_backends)
        show = render_fleet
    if args.json:
        print(dumps(report))
    else:
        show(report)
    return EXIT_SAME if report["same"] else EXIT_DIFFERENT
