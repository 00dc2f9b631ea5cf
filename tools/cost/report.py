"""The cost model's report of a submission: the per-launch model from ptxas' figures (or given
ones), the two-lane replay, the floors and the figure's sensitivity to its inputs, as a table or
JSON, with a measurement beside it."""
from __future__ import annotations

import json
from pathlib import Path

from coppelius.plan import launches, profiles

from tools.cost.kernel_stats import KernelStats, ptxas_stats
from tools.cost.lanes import lane_summary
from tools.cost.measured import compare, read_measured
from tools.cost.per_launch import model
from tools.cost.sensitivity import sensitivity
from tools.cost.table import floors, table, to_json


def lanes_of(profile, submission: str) -> dict[str, int]:
    """label → lane of each launch of the submission."""
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    return {x.label: x.lane for x in sub.launches}


def report(profile_name: str = "coppelius", target: str = "sm_90a", submission: str = "update",
           as_json: bool = False, measured: Path | None = None,
           stats: dict[str, KernelStats] | None = None) -> str:
    profile = profiles.get(profile_name)
    costs = model(profile, submission, stats if stats is not None else ptxas_stats(profile_name, target),
                  target)
    rows = read_measured(measured) if measured is not None else None
    beside = compare(costs, rows) if rows is not None else None   # refuses a table of another list
    sub = {s.name: s for s in launches.submissions(profile)}[submission]
    lane = lane_summary(sub, costs)
    floor = floors(costs, lanes_of(profile, submission))
    sens = sensitivity(sub, costs, lane["central"]["graph_us"])
    if as_json:
        j = to_json(costs, profile_name, target, submission, lane, floor, sens)
        if rows is not None:
            got = {r["label"]: float(r["us"]) for r in rows}
            for e in j["per_launch"]:
                if e["label"] in got:
                    e["measured_us"] = got[e["label"]]
            j["measured"] = rows
        return json.dumps(j, indent=1)
    text = table(costs, profile_name, target, submission, lane, floor, sens)
    if beside is not None:
        text += "\n\nModel vs measured (" + str(measured) + "):\n\n" + beside
    return text
