"""The bisect: two digests files walked in launch order, the first launch whose writes differ named.

Two files compare only when they describe the same computation: the same profile, plan (the
launch list and its regions), submission, step, c0, launch count and sample size — otherwise the
field is named (exit 2).  A write region differs bitwise (its sha256, the default) or, with
tolerances, when a sampled element differs by more than atol·s + rtol·|b| (s: the region's largest
|x| in either file — regions range from 1e-6 gradients to logits of ten nats, so no one absolute
tolerance fits them all) or a summary statistic moves further than the same rule allows (NaN and
Inf counts must be equal; integer regions always compare bitwise).  Volatile regions (device
times) never count.  A launch's inputs are equal when each read's bytes are (bitwise), or, with
tolerances, when both files trace the read to the same earlier write record and that record was
equal, else when its statistics are within tolerance: so a launch whose writes differ while its
inputs were equal *diverged*, one whose inputs differed *inherited* the difference.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coppelius.forensics.tolerances import DIGESTS_ACROSS
from coppelius.results.digests import DigestsError, number

# --across-backends defaults (why these: coppelius.forensics.tolerances)
ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL = DIGESTS_ACROSS
COMPARED = ("profile", "submission", "plan", "step", "c0", "launch_count", "sample")
INTEGER = ("i32", "u32")


class Incomparable(DigestsError):
    """Two digests files that do not describe the same computation."""


@dataclass(frozen=True)
class Rules:
    atol: float = 0.0       # × the region's largest |x|
    rtol: float = 0.0

    @property
    def bitwise(self) -> bool:
        return self.atol == 0 and self.rtol == 0


def check_comparable(a: dict, b: dict, pa, pb) -> None:
    for key in COMPARED:
        if a[key] != b[key]:
            raise Incomparable(f"{pa} and {pb} describe different computations: {key} "
                               f"{a[key]!r} vs {b[key]!r}",
                               "digest the same step of the same profile and plan on both")
    for xa, xb in zip(a["launches"], b["launches"]):
        names = [(r["name"], r["count"]) for r in xa["reads"] + xa["writes"]]
        if xa["label"] != xb["label"] or names != [(r["name"], r["count"])
                                                   for r in xb["reads"] + xb["writes"]]:
            raise Incomparable(f"{pa} and {pb}: launch {xa['index']} is {xa['label']} with "
                               f"other regions in one of them", "digest both with one coppelius")


def _sample_diff(ra: dict, rb: dict, rules: Rules) -> dict:
    """Max abs/rel difference over the sample, the first differing sampled element, how many go
    beyond the tolerances."""
    va = np.array([number(x) for x in ra["sample"]], np.float64)
    vb = np.array([number(x) for x in rb["sample"]], np.float64)
    same_bits = (va == vb) | (np.isnan(va) & np.isnan(vb))
    with np.errstate(invalid="ignore"):
        d = np.where(same_bits, 0.0, np.abs(va - vb))
    d = np.where(np.isnan(d), np.inf, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d == 0, 0.0, d / np.abs(vb))
    scale = max(ra["max_abs"], rb["max_abs"])
    beyond = ~same_bits if rules.bitwise or ra["dtype"] in INTEGER else \
        d > rules.atol * scale + rules.rtol * np.nan_to_num(np.abs(vb), posinf=0.0)
    out = {"max_abs": float(d.max(initial=0.0)), "max_rel": float(rel.max(initial=0.0)),
           "sampled_differing": int((~same_bits).sum()), "beyond": int(beyond.sum())}
    k = np.flatnonzero(~same_bits)
    if k.size:
        out.update(first_index=int(ra["sample_index"][k[0]]), a=ra["sample"][k[0]],
                   b=rb["sample"][k[0]])
    return out


def _stats_beyond(ra: dict, rb: dict, rules: Rules) -> list[str]:
    """The summary statistics that move further than the tolerances allow."""
    t = rules.atol + rules.rtol
    scale = max(ra["max_abs"], rb["max_abs"])
    out = [k for k in ("nan", "inf") if ra[k] != rb[k]]
    if abs(ra["max_abs"] - rb["max_abs"]) > t * scale:
        out.append("max_abs")
    if abs(ra["sum"] - rb["sum"]) > t * max(ra["abs_sum"], rb["abs_sum"]):
        out.append("sum")
    if abs(ra["sum_sq"] - rb["sum_sq"]) > (2 * t + t * t) * max(ra["sum_sq"], rb["sum_sq"]):
        out.append("sum_sq")
    return out


def region_diff(ra: dict, rb: dict, rules: Rules) -> dict | None:
    """None when the two records are equal under the rules, else what differs."""
    if ra.get("volatile") or ra["sha256"] == rb["sha256"]:
        return None
    out = {k: ra[k] for k in ("name", "space", "offset", "dtype", "count")}
    exact = rules.bitwise or ra["dtype"] in INTEGER
    stats = [] if exact else _stats_beyond(ra, rb, rules)
    if "sample" in ra:
        out.update(_sample_diff(ra, rb, rules))
    if not exact and not stats and not out.get("beyond"):
        return None
    out["stats_beyond"] = stats
    out["stats"] = {k: [ra[k], rb[k]] for k in ("sum", "abs_sum", "sum_sq", "max_abs", "nan",
                                                 "inf")}
    return out


def _read_equal(ra: dict, rb: dict, rules: Rules, equal_writes: dict) -> bool:
    if ra.get("volatile") or ra["sha256"] == rb["sha256"]:
        return True
    if rules.bitwise or ra["dtype"] in INTEGER:
        return False
    source = ra.get("source")
    if source is not None and source == rb.get("source"):
        return equal_writes[tuple(source)]
    return not _stats_beyond(ra, rb, rules)


def _launch(xa: dict, xb: dict, diffs: list, unequal_reads: list) -> dict:
    return {"index": xa["index"], "label": xa["label"], "function": xa["function"],
            "kernel": xa["kernel"], "lane": xa["lane"],
            "code": {"a": xa["code"], "b": xb["code"], "same": xa["code"] == xb["code"]},
            "inputs_equal": not unequal_reads,
            "verdict": "inherited" if unequal_reads else "diverged",
            "inputs_differing": unequal_reads, "regions": diffs}


def _side(doc: dict, path) -> dict:
    return {"path": str(path), **{k: doc[k] for k in ("backend", "device", "target", "profile",
                                                      "step", "c0", "context",
                                                      "replay_matches_issue")}}


def bisect(a: dict, b: dict, rules: Rules, pa="A", pb="B") -> dict:
    """The comparison of two digests files (host/digests.read): the first differing launch with
    its verdict and region differences, and every later differing launch's verdict."""
    check_comparable(a, b, pa, pb)
    equal_writes, differing = {}, []
    for xa, xb in zip(a["launches"], b["launches"]):
        i = xa["index"]
        unequal = [ra["name"] for ra, rb in zip(xa["reads"], xb["reads"])
                   if not _read_equal(ra, rb, rules, equal_writes)]
        diffs = []
        for j, (ra, rb) in enumerate(zip(xa["writes"], xb["writes"])):
            d = region_diff(ra, rb, rules)
            equal_writes[(i, j)] = d is None
            if d is not None:
                diffs.append(d)
        if diffs:
            differing.append(_launch(xa, xb, diffs, unequal))
    later = [{k: x[k] for k in ("index", "label", "verdict")} for x in differing[1:]]
    return {"same": not differing, "bitwise": rules.bitwise, "atol": rules.atol,
            "rtol": rules.rtol, "a": _side(a, pa), "b": _side(b, pb),
            "launches": a["launch_count"], "differing": len(differing),
            "first": differing[0] if differing else None, "later": later}


def soak(doc: dict, path="digests") -> dict:
    """A soak's digests file (`coppelius run … --digests FILE --soak K`): every repetition that
    differs from the first is a transient fault (the same step, from the same saved state, on the
    same device), named by the first launch whose writes differ from the first repetition's and
    its regions (bitwise); a file without a soak is refused."""
    info = doc.get("soak")
    if not isinstance(info, dict) or "differing" not in info:
        raise DigestsError(f"{path}: no soak in this digests file",
                           "make it with coppelius run … --digests FILE --soak K")
    faults = []
    for rep in info["differing"]:
        other = dict(doc, launches=rep["launches"])
        found = bisect(doc, other, Rules(), f"{path} (repetition 0)",
                       f"{path} (repetition {rep['repetition']})")
        if found["first"] is not None:
            f = found["first"]
            faults.append({"repetition": rep["repetition"], "launch": f["index"],
                           "label": f["label"], "kernel": f["kernel"], "verdict": f["verdict"],
                           "regions": f["regions"], "later": found["later"]})
    return {"path": str(path), "profile": doc["profile"], "step": doc["step"],
            "backend": doc["backend"], "device": doc["device"],
            "repetitions": info["repetitions"], "transient": faults,
            "same": not faults,
            "verdict": ("no transient fault" if not faults else
                        f"transient fault in {len(faults)} of {info['repetitions']} repetitions")}
