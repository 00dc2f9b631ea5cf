"""`coppelius fleet-script NAME [-o PATH]`: print a shipped Slurm script (or the alert rules), or
write it (a script executable)."""
from __future__ import annotations

import os
import sys

ORDER = 85
EXECUTABLE_MODE = 0o755     # a script Slurm runs: rwx for its owner, rx for the rest (less umask)
DATA_MODE = 0o644           # the alert rules: a file Prometheus reads, never runs


def register(sub) -> None:
    from coppelius.slurm import SCRIPTS
    names = ", ".join(f"{n} ({what})" for n, (_, what) in SCRIPTS.items())
    p = sub.add_parser("fleet-script",
                       help="print a Slurm script of the fleet path: " + ", ".join(SCRIPTS),
                       description=f"The shipped Slurm scripts: {names}.  README, Fleet "
                                   "regression, shows how they fit together.")
    p.add_argument("name", choices=sorted(SCRIPTS), help="which script")
    p.add_argument("-o", "--output", help="write it here (mode 0755; the rules 0644) instead of "
                                          "printing it; an existing file is refused unless "
                                          "--force")
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.set_defaults(func=run)


SHEBANG = b"#!"
SCRIPT_MARK = b"\n# Coppelius "     # the comment under every shipped script's first line
SCRIPT_HEAD = 4096


def recognize(path) -> str | None:
    """None when the file at `path` is a fleet script (one of the shipped scripts, any version:
    a shebang, then their `# Coppelius …` comment) or empty; else what it is instead."""
    from coppelius.staging import paths
    head = paths.head_bytes(path, SCRIPT_HEAD)
    if not head and not os.path.getsize(path):
        return None
    if head.startswith(SHEBANG) and SCRIPT_MARK in head:
        return None
    return "it is no script `coppelius fleet-script` writes"


def run(args) -> int:
    from coppelius.slurm import path
    from coppelius.staging import paths

    text = path(args.name).read_bytes()
    if args.output is None:
        sys.stdout.buffer.write(text)
        return 0
    # --force replaces a script this command wrote, never another file at that path
    paths.check_output(args.output, "script", overwrite=args.force,
                       exists_hint="pass --force to replace it, or another -o path",
                       recognize=recognize, foreign_hint="name another -o path", flag="--force")
    with paths.atomic_write(args.output, "script") as f:
        f.write(text)
    mode = EXECUTABLE_MODE if path(args.name).suffix == ".sh" else DATA_MODE
    os.chmod(args.output, mode & ~paths.current_umask())
    print(f"wrote {args.output} ({args.name}: {len(text):,} bytes)")
    return 0
