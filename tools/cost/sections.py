"""Sections of the cost model's text report: the lanes as the schedule replays them, the
per-kernel table of dependent round trips the PTX pass counts, and the figure's sensitivity to
its inputs."""
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
        "until their last CTA had an SM (a CTA waits for an SM with room for its registers and "
        f"shared memory, and grids dispatch {_dispatch_order(c)}).  Were later grids allowed to "
        "take the SMs the first cannot use (backfill) the graph would end at "
        f"{c['backfill_graph_us']:.0f} µs.", "",
        *rows, "",
        f"Programmatic edges: {c['programmatic_edges']} of {len(costs)} launches follow their "
        f"lane's previous launch programmatically (resident at their wait, working "
        f"LAUNCH_PDL = {LAUNCH_PDL['central'] * 1e6:.1f} µs after it ends, against LAUNCH = "
        f"{LAUNCH['central'] * 1e6:.1f} µs for a full edge); with every edge full the graph "
        "would end at " + " / ".join(f"{lane[s]['full_edges_graph_us']:.0f}" for s in SCENARIOS)
        + " µs (optimistic / central / pessimistic).  Bytes read right after a predecessor wrote "
        f"them: {fresh / 1e6:,.0f} MB, {L2_RESIDENT['central']:.0%} of them charged to L2, not "
        "HBM (central).", "", windows_text(c["windows"])])


def windows_text(windows: list[dict]) -> str:
    """lanes.windows (central) as a sentence and a table: how near each window of the replay runs
    to its L2, HBM and tensor floors."""
    rows = ["| window | µs | launches | L2 MB | HBM MB | GFLOP | L2 use | HBM use | tensor use |",
            "|---|---|---|---|---|---|---|---|---|"]
    for w in windows:
        rows.append(f"| {w['window']} {w['start_us']:.0f} → {w['end_us']:.0f} | "
                    f"{w['end_us'] - w['start_us']:.0f} | {w['launches']} | "
                    f"{w['l2_bytes'] / 1e6:,.0f} | {w['hbm_bytes'] / 1e6:,.0f} | "
                    f"{w['flops'] / 1e9:.1f} | {w['l2_use']:.0%} | {w['hbm_use']:.0%} | "
                    f"{w['tensor_use']:.0%} |")
    return "\n".join([
        "Windows of the replay (central; tools/cost/lanes.py `windows`): cut at the first "
        "main-lane launch of the backward, each window's bytes and FLOPs over its time at L2_BW, "
        "HBM_BW and BF16_FLOPS.  A window near its L2 or HBM rate goes faster only with fewer "
        "bytes; one far below every rate waits on chains, launches and tails.", "", *rows])


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


def _value(x: float) -> str:
    """An input's value as the tornado table shows it: seconds in µs, rates in T/s or G/s."""
    if 0 < x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    if x >= 1e11:
        return f"{x / 1e12:.3g} T/s"
    if x >= 1e8:
        return f"{x / 1e9:.3g} G/s"
    return f"{x:.3g}"


def sensitivity_text(sens: dict, floor: dict, launches: int, submission: str = "update") -> str:
    """The figure with its input brackets and the tornado table (sensitivity.sensitivity)."""
    rows = sens["rows"]
    by = {r["input"]: r for r in rows}
    top = [r["input"] for r in rows[:3]]
    brackets = "; ".join(
        f"{name} {_value(by[name]['optimistic'])} / {_value(by[name]['pessimistic'])} → "
        f"{by[name]['optimistic_us']:.0f} / {by[name]['pessimistic_us']:.0f} µs"
        for name in sens["bracketed"] if name in by)
    f = floor
    out = [f"The {submission}'s central figure, {sens['central_us']:.0f} µs over {launches} launches, "
           f"with each input moved alone to its optimistic / pessimistic value: {brackets}.  The "
           f"L2 floor is {f['optimistic']['l2']:.0f} / {f['central']['l2']:.0f} / "
           f"{f['pessimistic']['l2']:.0f} µs at L2_BW's three values, the HBM floor "
           f"{f['optimistic']['hbm']:.0f} / {f['central']['hbm']:.0f} / "
           f"{f['pessimistic']['hbm']:.0f} µs at HBM_BW's.  The figure is most sensitive to "
           + ", ".join(top) + f".  With every grid packed on the fewest SMs its occupancy allows "
           f"(ceil(CTAs / CTAs per SM), not one CTA per SM first) it would be "
           f"{sens['packed_us']:.0f} µs.", "",
           f"Sensitivity (tools/cost/sensitivity.py): the {submission}, central, with one input at a "
           "time at its optimistic or pessimistic value (inputs.py, each with its source), the "
           "largest swing first.", "",
           f"| input | optimistic | central | pessimistic | {submission} µs, optimistic | "
           f"{submission} µs, pessimistic | swing µs |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['input']} | {_value(r['optimistic'])} | {_value(r['central'])} | "
                   f"{_value(r['pessimistic'])} | {r['optimistic_us']:.0f} | "
                   f"{r['pessimistic_us']:.0f} | {r['swing_us']:.0f} |")
    return "\n".join(out)
