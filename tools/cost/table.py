"""The cost model's output: buckets of launches, where the time goes, the floors no schedule
beats, the JSON document and the markdown table."""
from __future__ import annotations

from dataclasses import asdict, fields

from tools.cost.inputs import BF16_FLOPS, HBM_BW, INPUTS, L2_BW, L2_RESIDENT, LAUNCH, LAUNCH_PDL, SCENARIOS
from tools.cost.per_launch import LaunchCost
from tools.cost.sections import lanes_text, round_trips_table, sensitivity_text
from tools.cost.sensitivity import brackets


def totals(costs) -> dict[str, float]:
    return {s: sum(c.us[s] for c in costs) for s in SCENARIOS}


def buckets(costs) -> list[dict]:
    groups: dict[str, list[LaunchCost]] = {}
    for c in costs:
        groups.setdefault(c.bucket, []).append(c)
    rows = []
    for name, cs in groups.items():
        binds = {}
        for c in cs:
            binds[c.binding["central"]] = binds.get(c.binding["central"], 0) + 1
        rows.append({"bucket": name, "n": len(cs), "kernel": cs[0].kernel, "regs": cs[0].regs,
                     "smem": cs[0].smem, "per_sm": cs[0].per_sm, "rounds": cs[0].rounds,
                     "flops": sum(c.flops for c in cs), "l2_bytes": sum(c.l2_bytes for c in cs),
                     "hbm_bytes": sum(c.hbm_bytes for c in cs),
                     "staging_bytes": sum(c.staging_read_bytes + c.staging_write_bytes for c in cs),
                     "binding": max(binds, key=binds.get), "us": totals(cs)})
    return sorted(rows, key=lambda r: -r["us"]["central"])


def where_time_goes(costs, s: str = "central") -> dict[str, float]:
    """µs of the summed estimate by binding term, the launch costs apart."""
    out = {"launch": 0.0}
    for c in costs:
        out[c.binding[s]] = out.get(c.binding[s], 0.0) + c.us[s] - LAUNCH[s] * 1e6
        out["launch"] += LAUNCH[s] * 1e6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def floors(costs, lanes_of) -> dict[str, dict[str, float]]:
    """Per scenario, µs: what no schedule of these launches beats — every FLOP at the chip's bf16
    rate, every L2 byte at L2_BW, every HBM byte at HBM_BW (perfect overlap, no tail), and the
    launch costs of the longest lane (its launches run one after another; LAUNCH_PDL for an
    edge that is programmatic, LAUNCH for the others).  The graph's time is at
    least the largest (the lane model shares L2 and HBM bandwidth and never lends SMs): a plan
    whose largest floor exceeds a goal cannot meet it by scheduling, only by moving fewer bytes."""
    def launch_costs(lane, s):
        return sum(LAUNCH_PDL[s] if c.programmatic else LAUNCH[s] for c in costs
                   if lanes_of[c.label] == lane)
    flops = sum(c.flops for c in costs)
    l2 = sum(c.l2_bytes for c in costs)
    return {s: {"tensor": flops / BF16_FLOPS[s] * 1e6, "l2": l2 / L2_BW[s] * 1e6,
                "hbm": sum(hbm_charged(c, s) for c in costs) / HBM_BW[s] * 1e6,
                "launches": max(launch_costs(lane, s) for lane in set(lanes_of.values())) * 1e6}
            for s in SCENARIOS}


def hbm_charged(c: LaunchCost, s: str) -> float:
    """A launch's HBM bytes in scenario s: the fresh bytes still in L2 apart (bounds.hbm_bytes)."""
    return c.hbm_bytes - L2_RESIDENT[s] * c.fresh_bytes


def round_trips(costs) -> list[dict]:
    """One row per kernel of the list (first launch order): the PTX's dependent round trips
    (ptx_chain.Chain via per_launch.chain_row) and the launches that run it."""
    rows: dict[str, dict] = {}
    for c in costs:
        r = rows.setdefault(c.kernel, {"kernel": c.kernel, "function": c.function, "launches": 0,
                                       **c.round_trips})
        r["launches"] += 1
    return list(rows.values())


def launch_json(c: LaunchCost) -> dict:
    """A launch's figures for the JSON (its Work, which the lane schedule reads, left out)."""
    return {f.name: getattr(c, f.name) for f in fields(c) if f.name != "work"}


def to_json(costs, profile_name: str, target: str, submission: str, lane: dict,
            floor: dict, sens: dict) -> dict:
    """`<submission>_us`: the graph's time on two lanes; `figure`: its central µs with the
    brackets of the inputs it is quoted under (sensitivity.brackets), the launch count and the
    L2 and HBM floors per scenario; `sensitivity`: the tornado table (sensitivity.sensitivity);
    `lanes`: per lane its start and end and which is critical (central), each scenario's replay
    under `scenarios`; `serial_sum_us`: every launch alone, one after another (what the buckets —
    the per-family table — and where_us add up to); `floors_us`: what no schedule of these
    launches beats (`floors`); `round_trips`: per kernel, the PTX's dependent round trips per
    tile."""
    c = lane["central"]
    return {"profile": profile_name, "target": target, "submission": submission,
            "launches": len(costs),
            f"{submission}_us": {s: lane[s]["graph_us"] for s in SCENARIOS},
            "figure": {"central_us": c["graph_us"], "launches": len(costs),
                       "brackets": brackets(sens),
                       "l2_floor_us": {s: floor[s]["l2"] for s in SCENARIOS},
                       "hbm_floor_us": {s: floor[s]["hbm"] for s in SCENARIOS},
                       "most_sensitive_to": [r["input"] for r in sens["rows"][:3]]},
            "sensitivity": sens,
            "serial_sum_us": totals(costs),
            "lanes": {**c["lanes"], "critical": c["critical"], "scenarios": lane},
            "floors_us": floor, "round_trips": round_trips(costs),
            "where_us": {s: where_time_goes(costs, s) for s in SCENARIOS},
            "buckets": buckets(costs), "per_launch": [launch_json(x) for x in costs],
            "inputs": {k: asdict(r) for k, r in INPUTS.items()}}


def fmt_us(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def table(costs, profile_name: str, target: str, submission: str, lane: dict,
          floor: dict, sens: dict) -> str:
    tot = totals(costs)
    out = [f"H200 cost model: {submission} submission, {profile_name}, {target} — "
           f"{len(costs)} launches (a prediction: nothing here was measured on a GPU)", "",
           "| bucket | n | regs | smem KB | per SM | rounds | GFLOP | L2 MB | HBM MB | PCIe MB | "
           "binds | optimistic µs | central µs | pessimistic µs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in buckets(costs):
        out.append(f"| {r['bucket']} | {r['n']} | {r['regs']} | {r['smem'] / 1024:.0f} | {r['per_sm']} | "
                   f"{r['rounds']} | {r['flops'] / 1e9:.1f} | {r['l2_bytes'] / 1e6:.0f} | "
                   f"{r['hbm_bytes'] / 1e6:.0f} | {r['staging_bytes'] / 1e6:.2f} | {r['binding']} | "
                   + " | ".join(fmt_us(r["us"][s]) for s in SCENARIOS) + " |")
    out.append(f"| **total** | {len(costs)} | | | | | {sum(c.flops for c in costs) / 1e9:.1f} | "
               f"{sum(c.l2_bytes for c in costs) / 1e6:.0f} | {sum(c.hbm_bytes for c in costs) / 1e6:.0f} | "
               f"{sum(c.staging_read_bytes + c.staging_write_bytes for c in costs) / 1e6:.2f} | | "
               + " | ".join(f"**{tot[s]:.0f}**" for s in SCENARIOS) + " |")
    out.append("| **graph, two lanes** (tools/cost/lanes.py) | | | | | | | | | | | "
               + " | ".join(f"**{lane[s]['graph_us']:.0f}**" for s in SCENARIOS) + " |")
    c = lane["central"]
    out += ["", lanes_text(costs, lane), "", round_trips_table(round_trips(costs))]
    f = floor["central"]
    top = max(f, key=f.get)
    out += ["", "Floors (central; no schedule of these launches beats them): "
            f"L2 {f['l2']:.0f} µs ({sum(x.l2_bytes for x in costs) / 1e6:,.0f} MB at "
            f"{L2_BW['central'] / 1e12:.1f} TB/s), HBM {f['hbm']:.0f} µs "
            f"({sum(hbm_charged(x, 'central') for x in costs) / 1e6:,.0f} MB at "
            f"{HBM_BW['central'] / 1e12:.1f} TB/s; fresh bytes in L2 apart), "
            f"tensor {f['tensor']:.0f} µs ({sum(x.flops for x in costs) / 1e9:.1f} GFLOP at "
            f"{BF16_FLOPS['central'] / 1e12:.0f} TFLOP/s), the longest lane's launch costs "
            f"{f['launches']:.0f} µs; the graph is {c['graph_us'] / f[top]:.2f}× its largest "
            f"({top})."]
    out += ["", sensitivity_text(sens, floor, len(costs), submission)]
    w = where_time_goes(costs)
    out += ["", "Where the central estimate goes (µs, by each launch's binding term): "
            + ", ".join(f"{k} {v:.0f}" for k, v in w.items()) + "."]
    staged = [c for c in costs if c.staging_read_bytes]
    if staged:
        out.append("Mapped host memory read by: " + "; ".join(
            f"{c.label} {c.staging_read_bytes:,.0f} B in {c.staging_requests:,} requests "
            f"({c.bounds_us['pcie']['central']:.1f} µs central, "
            f"{c.bounds_us['pcie']['pessimistic']:.1f} pessimistic)" for c in staged) + ".")
    return "\n".join(out)
