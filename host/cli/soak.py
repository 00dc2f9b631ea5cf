"""`coppelius soak FILE`: the transient faults of a soak (`coppelius run … --digests FILE --soak K`:
one update step replayed K times from one saved state), each named by its repetition, the first
launch whose writes differ from the first repetition's, and its region.  A GPU that differs from a
reference in every repetition is a persistent fault: `coppelius bisect REF FILE` names it.
Exit 0 no repetition differs, 1 one does, 2 the file is unreadable or holds no soak."""
from __future__ import annotations

ORDER = 36


def register(sub) -> None:
    p = sub.add_parser("soak", help="name the transient faults of a soak's digests file",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("file", metavar="FILE", help="digests file of `coppelius run --soak K`")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius.cli.console import report_console, styled
    from coppelius.forensics.api import dumps
    from coppelius.forensics.bisect import soak
    from coppelius.results import digests

    rep = soak(digests.read(args.file), args.file)
    if args.json:
        print(dumps(rep))
        return 0 if rep["same"] else 1
    c = report_console()
    c.print(f"{rep['path']}: {rep['profile']} update step {rep['step']} on {rep['backend']}, "
            f"{rep['device']}; {rep['repetitions']} repetitions from one saved state")
    colour = "bold green" if rep["same"] else "bold red"
    c.print(styled((rep["verdict"], colour)))
    for f in rep["transient"]:
        regions = ", ".join(f"{d['name']} → {d['space']}[{d['offset']}:+{d['count']}]"
                            for d in f["regions"])
        c.print(f"  repetition {f['repetition']}: transient fault at launch #{f['launch']} "
                f"{f['label']} (kernel {f['kernel']}, {f['verdict']}): {regions}")
    return 0 if rep["same"] else 1
