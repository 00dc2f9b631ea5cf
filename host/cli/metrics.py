"""`coppelius metrics`: the verdicts of result files that runs left elsewhere (the fleet's job
array, the Slurm node check) as Prometheus metrics, the same series `coppelius node --metrics`
writes (docs/NODE.md, "Metrics").  Exit 0 written, 2 refused (the verdicts are in the file)."""
from __future__ import annotations

import socket
from pathlib import Path

ORDER = 16


def register(sub) -> None:
    p = sub.add_parser("metrics", help="result files' verdicts as Prometheus metrics (the fleet "
                       "gather, the node check)",
                       description="Judge result files as `coppelius node` does (against "
                       "--expect, else their majority; a tie is reported, never guessed) and "
                       "write every GPU's verdict and what its run measured in Prometheus' text "
                       "format, for node exporter's textfile collector (docs/NODE.md).")
    p.add_argument("results", nargs="*", type=Path, metavar="RESULT",
                   help="a result file of one GPU, labelled with --host or else its name "
                   "without .bin (the job array's <node>.bin), and no index")
    p.add_argument("--gpu", nargs=2, action="append", default=[], metavar=("INDEX", "RESULT"),
                   help="a result file of GPU INDEX (CUDA's ordinal) of --host; repeat per GPU")
    p.add_argument("--host", metavar="NAME",
                   help="the Hostname label of every file (default: a RESULT's name, "
                   "this host's name for --gpu)")
    p.add_argument("--expect", type=Path, metavar="FILE|DIR",
                   help="the known-good result file, or a directory of them (default: the "
                   "files' majority class)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                   help="the metrics file, replaced atomically (node exporter reads *.prom)")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius.node.gathered import Gathered, rows
    from coppelius.node.metrics import VERDICTS, MetricsRefused, check, write

    if not args.results and not args.gpu:
        raise MetricsRefused("no result file named",
                             "name result files, or --gpu INDEX RESULT for each GPU")
    found = [Gathered(args.host or p.stem, "", p) for p in args.results]
    for index, path in args.gpu:
        if not index.isdigit():
            raise MetricsRefused(f"--gpu {index} {path}: INDEX {index!r} is not a GPU ordinal",
                                 "e.g. --gpu 0 gpu0.bin")
        found.append(Gathered(args.host or socket.gethostname(), str(int(index)), Path(path)))
    check(args.output)                  # before any result is read
    gpus = rows(found, args.expect)
    write(gpus, args.output)
    counts = ", ".join(f"{sum(g.verdict == v for g in gpus)} {v}" for v in VERDICTS)
    print(f"wrote {args.output}: {len(gpus)} GPU(s), {counts}")
    return 0
