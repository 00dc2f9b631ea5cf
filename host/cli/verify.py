"""`coppelius verify`: recompute a result file's first steps with the numpy reference and compare.

The command: arguments and the table; the recomputation and the comparison are
`coppelius.forensics.verify`, the tolerances `coppelius.forensics.tolerances`."""
from __future__ import annotations

import tempfile
from pathlib import Path

from coppelius.staging.synthetic import DEFAULT_DIRECTORY

from coppelius.forensics.tolerances import MEAN_ATOL, ROW_ATOL

ORDER = 40


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


def _stream_directory(args, scratch: str):
    """Where verify finds the embedded stream: --directory when the result's profile's stream is
    there, else `scratch` (generated there and dropped after: verify writes nothing of its own)."""
    if args.tokens is not None:
        return args.directory
    from coppelius.results.reader import read
    from coppelius.staging.synthetic import STREAM_SUFFIX
    name = f"{read(args.result).profile.name}{STREAM_SUFFIX}"
    return args.directory if (Path(args.directory) / name).exists() else Path(scratch)


def run(args) -> int:
    from rich.table import Table

    from coppelius.cli.console import report_console, styled
    from coppelius.forensics.verify import verify

    with tempfile.TemporaryDirectory(prefix="coppelius-verify-") as scratch:
        rep = verify(args.result, args.tokens, args.steps, args.checkpoint, args.mean_atol,
                     args.row_atol, _stream_directory(args, scratch))
    console = report_console()
    table = Table(title=f"verify {args.result} ({rep['profile']}, c0={rep['c0']}, "
                  f"{rep['steps']} steps)")
    for col in ("what", "result", "reference", "max |Δ|", "tolerance", "verdict"):
        table.add_column(col)

    def verdict(ok: bool):
        return "ok" if ok else styled(("differs", "red"))

    f = rep["forward"]
    table.add_row("forward logits", f"row {f['row']} col {f['col']}: {f['result']:.5f}",
                  f"{f['reference']:.5f}", f"{f['max_abs']:.2e}", f"{f['atol']:.0e}",
                  verdict(f["ok"]))
    for s in rep["losses"]:
        table.add_row(f"step {s['step']} loss", f"{s['result_mean']:.6f}",
                      f"{s['reference_mean']:.6f}",
                      f"mean {s['mean_abs']:.1e}, row {s['worst_row']} {s['row_max_abs']:.1e}",
                      f"{s['mean_atol']:.0e} / {s['row_atol']:.0e}", verdict(s["ok"]))
    console.print(table)
    console.print("verified" if rep["ok"] else styled(("verification failed", "red")))
    if not rep["ok"] and args.tokens is None:
        console.print("recomputed on the embedded stream: a result trained on a token cache "
                      "(run --tokens CACHE) differs from it; verify it with the same --tokens CACHE",
                      soft_wrap=True)
    return 0 if rep["ok"] else 1
