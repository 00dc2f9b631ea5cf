"""Two sections of the cost model's text report: the lanes as the schedule replays them, and the
per-kernel table of dependent round trips the PTX pass counts."""
from __future__ import annotations

from tools.cost.inputs import L2_RESIDENT, LAUNCH, LAUNCH_PDL, SCENARIOS



def _dispatch_order(central: dict) -> str:
    """How the model's block scheduler picks the next grid (sm_sim.py): the priority lane's
    pending CTAs first where the plan names one, then launch order."""
    lane = central.get("priority_lane")
    if lane in (None, "none"):
        return "in launch order"
    return (f"the {lane} lane's first (its stream's greater priority), then in launch order; "
            f"with no priority the graph would end at {central['no_priority']['graph_us']:.0f} µs")

def lanes_text(costs, lane: dict) -> str:
    """The two-lane replay (lanes.lane_summary) in words: per lane its start and end, the critical
    lane, the side lane's waits for SMs, the full-edge and backfill variants."""
    c = lane["central"]
    per = "; ".join(f"{name} lane {v['start_us']:.0f} → {v['end_us']:.0f} µs"
                    for name, v in c["lanes"].items())
    rows = ["| scenario | graph µs | " + " | ".join(f"{n} start µs | {n} end µs" for n in c["lanes"])
            + " | critical |", "|---|---|" + "---|---|" * len(c["lanes"]) + "---|"]
    for s in SCENARIOS:
        x = lane[s]
        rows.append(f"| {s} | {x['graph_us']:.0f} | " + " | ".join(
            f"{v['start_us']:.0f} | {v['end_us']:.0f}" for v in x["lanes"].values())
            + f" | {x['critical']} |")
    fresh = sum(x.fresh_bytes for x in costs)
    return "\n".join([
        "Two lanes, CTA by CTA (tools/cost/lanes.py, sm_sim.py; central): " + per
        + f"; the {c['critical']} lane is critical.  Each lane's launches alone add up to "
        f"{c['main_lane_alone_us']:.0f} µs (main) and {c['side_lane_alone_us']:.0f} µs (side); "
        f"the side lane's launches waited {c['side_waited_us']:.0f} µs in all from their launch "
        "until their last CTA had an SM (a weight-gradient CTA needs an empty SM, and grids "
        f"dispatch {_dispatch_order(c)}).  Were later grids allowed to take the SMs the first "
        f"cannot use (backfill) the graph would end at {c['backfill_graph_us']:.0f} µs.", "",
        *rows, "",
        f"Programmatic edges: {c['programmatic_edges']} of {len(costs)} launches follow their "
        f"lane's previous launch programmatically (resident at their wait, working "
        f"LAUNCH_PDL = {LAUNCH_PDL['central'] * 1e6:.1f} µs after it ends, against LAUNCH = "
        f"{LAUNCH['central'] * 1e6:.1f} µs for a full edge); with every edge full the graph "
        "would end at " + " / ".join(f"{lane[s]['full_edges_graph_us']:.0f}" for s in SCENARIOS)
        + " µs (optimistic / central / pessimistic).  Bytes read right after a predecessor wrote "
        f"them: {fresh / 1e6:,.0f} MB, {L2_RESIDENT['central']:.0%} of them charged to L2, not "
        "HBM (central)."])


def round_trips_table(rows: list[dict]) -> str:
    """table.round_trips as markdown."""
    out = ["Dependent round trips per tile, from the PTX (tools/cost/ptx_chain.py): `tile` = the "
           "K loop's fill + the epilogue's chain (the whole program where there is no loop), "
           "`prologue` once per program before a tile loop, `per trip` each further trip of an "
           "unpipelined loop; the epilogue's issue slots per thread (MUFU of them) and barriers.",
           "", "| kernel | function | launches | tile | fill | epilogue | prologue | per trip | "
           "epilogue slots (MUFU) | barriers |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (-r["tile"], r["kernel"])):
        out.append(f"| {r['kernel']} | {r['function']} | {r['launches']} | {r['tile']} | "
                   f"{r['fill']} | {r['epilogue']} | {r['prologue']} | {r['per_trip']:g} | "
                   f"{r['epilogue_slots']} ({r['epilogue_mufu']}) | {r['epilogue_barriers']} |")
    return "\n".join(out)
