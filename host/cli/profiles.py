"""`coppelius profiles`: list the profiles with their dimensions, counts and identities."""
from __future__ import annotations

ORDER = 90


def register(sub) -> None:
    p = sub.add_parser("profiles", help="show the profiles: dimensions, parameter counts, identities")
    p.add_argument("--profile", help="show one profile's parameter table and identity strings")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius.cli.console import report_console, styled
    from rich.table import Table

    from coppelius.plan import profiles

    console = report_console()
    if args.profile:
        prof = profiles.get(args.profile)
        t = Table(title=f"profile {prof.name}: parameter table")
        for col in ("#", "name", "shape", "offset", "elements", "decay"):
            t.add_column(col, justify="right" if col in ("#", "offset", "elements") else "left")
        for i, prm in enumerate(prof.parameters):
            t.add_row(str(i), prm.name, "×".join(map(str, prm.shape)), f"{prm.offset:,}",
                      f"{prm.size:,}", "yes" if prm.decay else "no")
        console.print(t)
        for k, v in prof.identities.items():
            console.print(styled((k, "bold"), f": {v.decode()}"), soft_wrap=True)
        return 0
    t = Table(title="profiles")
    for col in ("name", "V", "T", "D", "L", "H/G", "head", "F", "parameters", "payload bytes",
                "chunks", "steps", "interval"):
        t.add_column(col, justify="right")
    for name in profiles.names():
        p = profiles.get(name)
        t.add_row(p.name, str(p.vocab), str(p.context), str(p.width), str(p.layers),
                  f"{p.heads}/{p.kv_heads}", str(p.head_dim), str(p.hidden),
                  f"{p.parameter_count:,}", f"{p.payload_bytes:,}", str(p.chunk_count),
                  f"{p.steps:,}", f"{p.checkpoint_interval:,}")
    console.print(t)
    return 0
