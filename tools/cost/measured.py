"""The model beside a measurement: the device check's per-launch table (`--measured FILE`, a JSON
list of {label, kernel, us}) read and refused when it is not of the modelled list, and the
model-vs-measured tables per launch and per bucket."""
from __future__ import annotations

import json
import math
from pathlib import Path

from coppelius.staging.errors import UserError

from tools.cost.inputs import SCENARIOS
from tools.cost.per_launch import LaunchCost
from tools.cost.table import fmt_us


def read_measured(path: Path) -> list[dict]:
    """The device check's per-launch table: a JSON list of {label, kernel, us}."""
    try:
        rows = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file", "give the device check's per-launch JSON") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not JSON ({e})", "a list of {label, kernel, us} objects") from None
    if not isinstance(rows, list):
        raise UserError(f"{path}: top level is {type(rows).__name__}, not a list",
                        "a list of {label, kernel, us} objects")
    for i, r in enumerate(rows):
        for key, kind in (("label", str), ("kernel", str), ("us", (int, float))):
            if not isinstance(r, dict) or not isinstance(r.get(key), kind) or isinstance(r.get(key), bool):
                raise UserError(f"{path}: entry {i} has no valid {key!r}",
                                "each entry is {\"label\": str, \"kernel\": str, \"us\": number}")
        if not r["us"] >= 0 or math.isinf(r["us"]):
            raise UserError(f"{path}: entry {i} ({r['label']}) has us = {r['us']}", "a time ≥ 0 in µs")
    return rows


def compare(costs, measured: list[dict]) -> str:
    """Model vs measured per launch and per bucket; refuses a table of another launch list."""
    by_label = {c.label: c for c in costs}
    seen = set()
    for r in measured:
        c = by_label.get(r["label"])
        if c is None:
            raise UserError(f"measured launch {r['label']!r} is not in the modelled list",
                            "measure the same profile and submission as the model")
        if c.kernel != r["kernel"]:
            raise UserError(f"measured {r['label']} ran {r['kernel']}, the model's is {c.kernel}",
                            "the measured table comes from another build of the PTX")
        if r["label"] in seen:
            raise UserError(f"launch {r['label']!r} measured twice", "one entry per launch")
        seen.add(r["label"])
    got = {r["label"]: float(r["us"]) for r in measured}
    out = ["| launch | function | binds | optimistic µs | central µs | pessimistic µs | measured µs | "
           "measured / central | in range |", "|---|---|---|---|---|---|---|---|---|"]
    for c in costs:
        if c.label not in got:
            continue
        m = got[c.label]
        inside = c.us["optimistic"] <= m <= c.us["pessimistic"]
        out.append(f"| {c.label} | {c.function} | {c.binding['central']} | "
                   + " | ".join(fmt_us(c.us[s]) for s in SCENARIOS)
                   + f" | {fmt_us(m)} | {m / c.us['central']:.2f} | {'yes' if inside else 'NO'} |")
    out += ["", "| bucket | measured / n | central µs | measured µs | measured / central |",
            "|---|---|---|---|---|"]
    groups: dict[str, list[LaunchCost]] = {}
    for c in costs:
        groups.setdefault(c.bucket, []).append(c)
    sums = []
    for name, cs in groups.items():
        hit = [c for c in cs if c.label in got]
        if hit:
            model_us = sum(c.us["central"] for c in hit)
            meas_us = sum(got[c.label] for c in hit)
            sums.append((name, len(hit), len(cs), model_us, meas_us))
    for name, k, n, model_us, meas_us in sorted(sums, key=lambda r: -r[4]):
        out.append(f"| {name} | {k}/{n} | {model_us:.0f} | {meas_us:.0f} | {meas_us / model_us:.2f} |")
    model_us = sum(r[3] for r in sums)
    meas_us = sum(r[4] for r in sums)
    out.append(f"| **measured launches** | {len(got)}/{len(costs)} | {model_us:.0f} | {meas_us:.0f} | "
               f"{(meas_us / model_us if model_us else float('nan')):.2f} |")
    missing = [c.label for c in costs if c.label not in got]
    if missing:
        out.append(f"\nNot measured ({len(missing)}): " + ", ".join(missing[:12])
                   + (" …" if len(missing) > 12 else ""))
    return "\n".join(out)
