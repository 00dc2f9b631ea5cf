"""The Slurm scripts a fleet operator runs, shipped with the package: a job array (one task per
node), a node check for a Prolog/Epilog, and the gather step; and the Prometheus alert rules on
the verdict metrics they can write (docs/NODE.md, "Metrics").  `coppelius fleet-script NAME`
prints one or writes it where the cluster keeps such files; README's "Fleet regression" section
shows how they fit together, from a run on a real Slurm (tests/host/slurm/test_slurm.py runs
these very files; tests/host/node/test_monitoring.py loads the rules into a real Prometheus)."""
from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
# name → (file, what it is for)
SCRIPTS = {
    "array": ("coppelius-array.sh", "a job array: the same run on every node, results named "
                                    "after the node"),
    "node-check": ("coppelius-node-check.sh", "a Prolog/Epilog check of this node's GPUs against "
                                              "a known-good result"),
    "gather": ("coppelius-gather.sh", "the classes of the gathered results and a verdict per "
                                      "node"),
    "rules": ("coppelius-rules.yml", "Prometheus alert rules on the verdict metrics (a FAIL, a "
                                     "run that could not run, a tie, a stale check)"),
}


def path(name: str) -> Path:
    """The shipped file of script `name` (a key of SCRIPTS)."""
    return FOLDER / SCRIPTS[name][0]
