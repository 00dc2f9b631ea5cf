"""`python -m tools.cost`: the cost model of one submission (`python -m tools.build_ptx --report`
is the update's, for every profile and target asked)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coppelius.staging.errors import UserError
from coppelius.plan import profiles

from tools.cost.report import report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.cost",
                                 description="H200 cost model of a submission's launch list")
    ap.add_argument("--profile", default="coppelius", choices=profiles.names())
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--submission", default="update", choices=("forward", "update", "final"))
    ap.add_argument("--json", action="store_true", help="the per-launch model as JSON")
    ap.add_argument("--measured", type=Path, help="a device check's per-launch JSON to compare with")
    a = ap.parse_args(argv)
    try:
        print(report(a.profile, a.target, a.submission, a.json, a.measured))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
