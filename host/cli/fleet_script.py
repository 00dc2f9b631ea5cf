"""`coppelius fleet-script NAME [-o PATH]`: print a shipped Slurm script, or write it (executable)."""
from __future__ import annotations

import os
import sys

ORDER = 85
EXECUTABLE_MODE = 0o755     # a script Slurm runs: rwx for its owner, rx for the rest (less umask)


def register(sub) -> None:
    from coppelius.slurm import SCRIPTS
    names = ", ".join(f"{n} ({what})" for n, (_, what) in SCRIPTS.items())
    p = sub.add_parser("fleet-script",
                       help="print a Slurm script of the fleet path: " + ", ".join(SCRIPTS),
                       description=f"The shipped Slurm scripts: {names}.  README, Fleet "
                                   "regression, shows how they fit together.")
    p.add_argument("name", choices=sorted(SCRIPTS), help="which script")
    p.add_argument("-o", "--output", help="write it here (mode 0755) instead of printing it; an "
                                          "existing file is refused unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius.slurm import path
    from coppelius.staging import paths
    from coppelius.staging.errors import UserError

    text = path(args.name).read_bytes()
    if args.output is None:
        sys.stdout.buffer.write(text)
        return 0
    if os.path.lexists(args.output) and not args.force:
        raise UserError(f"{args.output} exists", "pass --force to replace it, or another -o path")
    with paths.atomic_write(args.output, "script") as f:
        f.write(text)
    os.chmod(args.output, EXECUTABLE_MODE & ~paths.current_umask())
    print(f"wrote {args.output} ({args.name}: {len(text):,} bytes)")
    return 0
