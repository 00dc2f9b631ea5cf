"""The device check's experiments: the plan's riskiest assumptions, measured by graph replays.

Each experiment replays the update's graph captured two ways (capture options of CudaBackend: no
new Triton PTX) and sets the two side by side with the cost model's prediction of each:
  programmatic edges   the plan's programmatic edges against every edge full;
  lanes                two lanes (the weight gradients beside the backward's chain) against one
                       lane (every launch on one stream, in list order);
  side lane's work     the plan's graph against the same graph with each side-lane launch replaced
                       by a hand-written no-op kernel: if the graph barely moves the side lane is
                       hidden, if it drops by hundreds of µs it is the critical path;
  stream priority      the plan's priority lane (plan/launches/graph.PRIORITY_LANE, the cost
                       model's choice) on the higher-priority stream against no stream
                       priority (every lane at the default);
  side lane alone      each side-lane launch by itself on an idle GPU against its prediction.
`decide` says which variant the plan should keep.  Predictions are the cost model's
(tools/cost/, from the registers the driver reports); measurements come from the device.
"""
from __future__ import annotations

import dataclasses
import statistics

from coppelius.plan import launches
from coppelius.plan.launches.graph import programmatic
from coppelius.staging import layout as L

# capture variants: CudaBackend options (host/backends/cuda/backend.py) -> the graph each captures
PLAN_OPTIONS = {"pdl": True, "one_lane": False, "noop_side_lane": False, "priority": True}
GRAPH_VARIANTS = {
    "plan": PLAN_OPTIONS,
    "full-edges": {**PLAN_OPTIONS, "pdl": False},
    "one-lane": {**PLAN_OPTIONS, "one_lane": True},
    "noop-side-lane": {**PLAN_OPTIONS, "noop_side_lane": True},
    "no-priority": {**PLAN_OPTIONS, "priority": False},
}
EDGES, LANES, SIDE_WORK, PRIORITY, SIDE_ALONE = ("programmatic edges", "lanes", "side lane's work",
                                                 "stream priority", "side lane alone")
# experiment -> ((variant shown, capture variant) for the plan's, then for the alternative)
PAIRS = {
    EDGES: (("programmatic edges (the plan)", "plan"), ("every edge full", "full-edges")),
    LANES: (("two lanes (the plan)", "plan"), ("one lane", "one-lane")),
    SIDE_WORK: (("weight gradients on the side lane (the plan)", "plan"),
                ("side lane replaced by a no-op kernel", "noop-side-lane")),
    PRIORITY: (("the priority lane's stream first (the plan)", "plan"),
               ("no stream priority", "no-priority")),
}
SIDE_SUM = "every side-lane launch alone, summed"
DECISIVE_FRACTION = 0.02    # a variant wins when its graph is faster by more than this fraction
HIDDEN_FRACTION = 0.03      # the no-op side lane within this of the plan's graph: hidden
CRITICAL_US = 100.0         # the no-op side lane faster by at least this: the critical path
SCENARIO = "central"        # the prediction set beside each measurement


def set_capture(backend, variant: str) -> None:
    for option, value in GRAPH_VARIANTS[variant].items():
        setattr(backend, option, value)


def measure_graphs(backend, t_base: int, repeats: int) -> dict:
    """variant -> {graph_us: (repeats,), programmatic_edges, pdl_refused, lane_priorities,
    priority_note}; the backend is left captured as the plan captures it."""
    out = {}
    try:
        for variant in GRAPH_VARIANTS:
            set_capture(backend, variant)
            backend.pdl_refused = None
            backend.instantiate(t_base)
            out[variant] = {"graph_us": backend.time_graph(L.SUBMISSION_UPDATE, repeats),
                            "programmatic_edges": backend.programmatic_edges[L.SUBMISSION_UPDATE],
                            "pdl_refused": backend.pdl_refused,
                            "lane_priorities": dict(backend.lane_priorities),
                            "priority_note": backend.priority_note}
    finally:
        set_capture(backend, "plan")
        backend.instantiate(t_base)
    return out


def side_lane(profile) -> list[int]:
    """Indices of the update's side-lane launches."""
    update = launches.submissions(profile)[L.SUBMISSION_UPDATE]
    return [i for i, x in enumerate(update.launches) if x.lane == launches.SIDE_LANE]


def predicted(profile, costs: dict, kernel_pdl: dict) -> dict:
    """capture variant -> predicted graph µs (SCENARIO), each from the cost model's schedule of
    the graph that variant captures (tools/cost/lanes.py): the plan's; every edge full; one lane
    (the same launches chained on one stream, programmatic where two Triton kernels meet); the
    no-op side lane (each side-lane launch costed as the one-thread no-op kernel, with full
    edges into and out of it, as host/backends/cuda/capture.py captures it); no stream priority (the
    plan's graph, no lane's grids dispatched ahead of the other's).  The rest under the plan's
    priority lane."""
    if not costs:
        return {}
    from tools.cost import lanes
    update = launches.submissions(profile)[L.SUBMISSION_UPDATE]
    ordered = [costs[x.label] for x in update.launches]

    def graph_us(sub, shown, cs, priority_lane=lanes.PLAN) -> float:
        flagged = [dataclasses.replace(c, programmatic=ok and kernel_pdl.get(x.kernel, False))
                   for c, ok, x in zip(cs, programmatic(shown), sub.launches)]
        return lanes.schedule(sub, flagged, SCENARIO,
                              priority_lane=priority_lane).makespan_s * 1e6

    relaned = [dataclasses.replace(x, lane=launches.MAIN_LANE) for x in update.launches]
    chained = dataclasses.replace(update, launches=tuple(relaned),
                                  deps=tuple((i - 1,) if i else () for i in range(len(relaned))))
    noop_shown = [dataclasses.replace(x, function=launches.RELEASE) if x.lane == launches.SIDE_LANE
                  else x for x in update.launches]
    noop = [lanes.noop_cost(c) if x.lane == launches.SIDE_LANE else c
            for c, x in zip(ordered, update.launches)]
    full = [dataclasses.replace(c, programmatic=False) for c in ordered]
    return {"plan": graph_us(update, update.launches, ordered),
            "full-edges": lanes.schedule(update, full, SCENARIO).makespan_s * 1e6,
            "one-lane": graph_us(chained, relaned, ordered),
            "noop-side-lane": graph_us(update, noop_shown, noop),
            "no-priority": graph_us(update, update.launches, ordered, priority_lane=None)}


def _r(x):
    return None if x is None else round(float(x), 3)


def rows(profile, graphs: dict, alone: list, costs: dict, prediction: dict) -> list[dict]:
    """The report's `experiments`: {name, variant, graph_us, per_launch_us} and beside them the
    prediction (`predicted_us`), the minimum replay and the programmatic edges captured."""
    out = []
    for name, pair in PAIRS.items():
        for shown, variant in pair:
            g = graphs[variant]
            out.append({"name": name, "variant": shown, "capture": variant,
                        "graph_us": _r(statistics.median(g["graph_us"])),
                        "graph_us_min": _r(min(g["graph_us"])), "per_launch_us": None,
                        "predicted_us": _r(prediction.get(variant)),
                        "programmatic_edges": g["programmatic_edges"],
                        "pdl_refused": g["pdl_refused"],
                        "lane_priorities": g.get("lane_priorities"),
                        "priority_note": g.get("priority_note")})
    update = launches.submissions(profile)[L.SUBMISSION_UPDATE]
    measured = predicted_sum = 0.0
    for i, times in zip(side_lane(profile), alone):
        x = update.launches[i]
        c = costs.get(x.label)
        us = statistics.median(times)
        measured += us
        predicted_sum += c.us[SCENARIO] if c else 0.0
        out.append({"name": SIDE_ALONE, "variant": x.label, "kernel": x.kernel, "graph_us": None,
                    "per_launch_us": _r(us), "predicted_us": _r(c.us[SCENARIO]) if c else None})
    out.append({"name": SIDE_ALONE, "variant": SIDE_SUM, "graph_us": None,
                "per_launch_us": _r(measured), "predicted_us": _r(predicted_sum) if costs else None})
    return out


def _pair(rows_: list, name: str):
    found = [r for r in rows_ if r["name"] == name and r["graph_us"] is not None]
    return (found[0], found[1]) if len(found) == 2 else (None, None)


def decide(rows_: list) -> list[dict]:
    """Per experiment: the variant the plan should keep, and why (from the measurements)."""
    out = []
    for name in (EDGES, LANES, PRIORITY):
        plan, alt = _pair(rows_, name)
        if plan is None:
            out.append({"name": name, "keep": None, "why": "not measured"})
            continue
        gain = (plan["graph_us"] - alt["graph_us"]) / plan["graph_us"]
        delta = _r(plan["graph_us"] - alt["graph_us"])
        if name == EDGES and not plan["programmatic_edges"]:
            keep, why = alt["variant"], ("no programmatic edge was captured "
                                         f"({plan['pdl_refused'] or 'none allowed'})")
        elif name == PRIORITY and plan.get("priority_note"):
            keep, why = None, plan["priority_note"]
        elif gain > DECISIVE_FRACTION:
            keep, why = alt["variant"], f"{gain:.1%} faster ({delta} µs)"
        elif gain < -DECISIVE_FRACTION:
            keep, why = plan["variant"], f"{-gain:.1%} faster ({-delta} µs)"
        else:
            keep, why = plan["variant"], (f"within {DECISIVE_FRACTION:.0%} ({delta} µs): the "
                                          "plan's stays")
        predicted = (None if plan.get("predicted_us") is None or alt.get("predicted_us") is None
                     else _r(plan["predicted_us"] - alt["predicted_us"]))
        out.append({"name": name, "keep": keep, "why": why, "delta_us": delta,
                    "predicted_delta_us": predicted})
    plan, noop = _pair(rows_, SIDE_WORK)
    if plan is not None:
        delta = plan["graph_us"] - noop["graph_us"]
        if delta >= CRITICAL_US:
            why = (f"the critical path: without its work the graph is {delta:.0f} µs faster; "
                   "shorten the side lane or move work off it")
        elif delta <= HIDDEN_FRACTION * plan["graph_us"]:
            why = f"hidden: without its work the graph moves {delta:.0f} µs"
        else:
            why = f"partly exposed: without its work the graph is {delta:.0f} µs faster"
        out.append({"name": SIDE_WORK, "keep": plan["variant"], "why": why, "delta_us": _r(delta)})
    total = next((r for r in rows_ if r["variant"] == SIDE_SUM), None)
    if total and total["predicted_us"]:
        ratio = total["per_launch_us"] / total["predicted_us"]
        out.append({"name": SIDE_ALONE, "keep": None, "ratio": _r(ratio),
                    "why": f"measured {total['per_launch_us']:.0f} µs against the model's "
                           f"{total['predicted_us']:.0f} µs ({ratio:.2f}×)"})
    return out
