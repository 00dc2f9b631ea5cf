"""Shared by the cost model's tests (test_cost_model.py, test_cost_lanes.py): the production
profile's update list by label, ptxas-free kernel figures, a tight comparison."""
from __future__ import annotations

import dataclasses
import json
import math

from coppelius.plan import launches, profiles
from tools.cost.kernel_stats import KernelStats
from tests.support.paths import ROOT

PROD = profiles.get("coppelius")
UPDATE = {x.label: x for x in launches.submissions(PROD)[1].launches}
US = 1e6


def close(got: float, want: float, what: str):
    assert math.isclose(got, want, rel_tol=1e-9), f"{what}: model {got!r}, hand {want!r}"


def fake_stats(profile, regs: int = 64) -> dict:
    """ptxas-free figures: every kernel at `regs` registers, shared memory, threads and `pdl`
    from the committed manifest (the figures the model reads besides the registers)."""
    m = json.loads((ROOT / "kernels_ptx" / profile.name / "sm_90a" / "manifest.json").read_text())
    return {e: KernelStats(regs, r["shared"], r["threads"], pdl=r["pdl"])
            for e, r in m["kernels"].items()}


def side_fills_sms(sub, profile) -> dict:
    """fake_stats with every side-lane kernel at 250 registers × 256 threads: its CTAs need an
    empty SM, as the committed weight gradients' do."""
    stats = fake_stats(profile)
    for x in sub.launches:
        if x.lane == launches.SIDE_LANE:
            stats[x.kernel] = dataclasses.replace(stats[x.kernel], regs=250)
    return stats
