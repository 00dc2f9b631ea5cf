"""How far the update's figure moves with its unmeasured inputs: the central replay with each
input of inputs.py moved alone to its optimistic and then its pessimistic value (a tornado
table, sorted by swing), the brackets of the inputs the figure hangs on most, and the placement what-if.

Each row replays the whole graph (lanes.schedule) in an inputs.Scenario that moves the input: the
replay reads every launch's phases, bytes and launch costs under it, so an input reaches the
figure through every launch and the schedule alike.  An input whose moved value equals its central one is not
replayed again (its row repeats the central figure)."""
from __future__ import annotations

from tools.cost.inputs import INPUTS, Scenario
from tools.cost.lanes import schedule

BRACKETED = ("L2_BW", "HBM_LATENCY", "LAUNCH")   # the unmeasured inputs the figure is quoted under
ENDS = ("optimistic", "pessimistic")


def graph_us(sub, costs, s: str, pack: bool = False) -> float:
    """The graph's µs in scenario s (the replay reads each launch's Work under s: lanes.grid)."""
    return schedule(sub, costs, s, pack=pack).makespan_s * 1e6


def sensitivity(sub, costs, central_us: float) -> dict:
    """`rows`: per input its three values, the update's µs with it alone at each end
    (`optimistic_us`, `pessimistic_us`), `swing_us` (the largest less the smallest of those and
    the central figure) and its source, the largest swing first; `central_us`; `bracketed`: the
    inputs the figure is quoted under (BRACKETED); `packed_us`: the central replay with every
    grid packed on the fewest SMs its occupancy allows (sm_sim.py's `pack`, bounds.held_sms)
    instead of spread one CTA per SM first."""
    rows = []
    for name, r in INPUTS.items():
        row = {"input": name, "optimistic": r.optimistic, "central": r.central,
               "pessimistic": r.pessimistic}
        for end in ENDS:
            row[f"{end}_us"] = (central_us if r[end] == r.central else
                                graph_us(sub, costs, Scenario("central", ((r, end),))))
        figures = (row["optimistic_us"], central_us, row["pessimistic_us"])
        row["swing_us"] = max(figures) - min(figures)
        row["source"] = r.source
        rows.append(row)
    rows.sort(key=lambda x: (-x["swing_us"], x["input"]))
    return {"scenario": "central", "central_us": central_us, "rows": rows,
            "bracketed": list(BRACKETED), "packed_us": graph_us(sub, costs, "central", pack=True)}


def brackets(sens: dict) -> dict:
    """The BRACKETED inputs' rows of `sens`, by name: their two ends and the update at each."""
    by = {r["input"]: r for r in sens["rows"]}
    return {name: {k: by[name][k] for k in ("optimistic", "pessimistic", "optimistic_us",
                                            "pessimistic_us", "source")}
            for name in BRACKETED if name in by}
