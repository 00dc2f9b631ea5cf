"""A fleet of result files grouped into classes of identical results (CONTRACT §13).

A file joins the first class, in argument order, whose *first member* it matches under the
two-file rules (`coppelius.forensics.diff.compare`); otherwise it opens a new class.  Membership is tested against
that one file, never against every member, so the classes depend only on the argument order.
"""
from __future__ import annotations

from coppelius.forensics.diff import compare, describe, identity
from coppelius.results.reader import read


def classify(paths, atol: float = 0.0, rtol: float = 0.0, across_backends: bool = False) -> dict:
    """Group result files into classes of identical results (see the module docstring).

    Each file is read (memory-mapped) once and tested against the first member of each class in
    turn, each test stopping at the first difference beyond tolerance; it is dropped afterwards
    unless it opens a class, so memory and open files grow with the classes, not the files.  A file
    that opens a class is compared in full with class 1's first member, once: that comparison is
    the class's "first difference".  `reports[i]` is file i's full comparison: with its class's
    first member, or for a first member with class 1's (None for the first file).  Linear in the
    files: each costs one full comparison plus an early stop per earlier class.
    """
    classes, entries, reports = [], [], []        # classes: (first ResultFile, its entry)
    for path in paths:
        rf = read(path)                           # ResultFileError names the path: exit 2
        member = dict(describe(rf), **identity(rf))
        home = rep = None
        for first, entry in classes:
            rep = compare(first, rf, atol, rtol, across_backends, stop_early=True)
            if rep["same"]:                       # a full comparison: nothing stopped it
                home = entry
                break
        if home is None:
            rep = compare(classes[0][0], rf, atol, rtol, across_backends) if classes else None
            home = {"class": len(classes) + 1, "members": [], "member_details": [],
                    "verdict_vs_first": None if rep is None else rep["verdict"],
                    "first_difference": _first_difference(rep)}
            classes.append((rf, home))
            entries.append(home)
        member["verdict"] = rep["verdict"] if home["members"] else "first member"
        home["members"].append(str(path))
        home["member_details"].append(member)
        reports.append(rep)
        del rf                                    # a non-first member's map closes here
    return {"files": [str(p) for p in paths], "across_backends": across_backends,
            "atol": atol, "rtol": rtol, "same": len(entries) == 1,
            "verdict": "one class" if len(entries) == 1 else f"{len(entries)} classes",
            "classes": entries, "reports": reports}


def _first_difference(rep) -> dict | None:
    """Where a class's first member first differs from class 1: section, place, max abs/rel."""
    if rep is None:
        return None
    f = rep["first"]
    if f is None:
        return {"section": "structure", "where": "; ".join(rep["structure"]) or rep["verdict"]}
    out = {k: v for k, v in f.items() if k not in ("a_bits", "b_bits")}
    sect = next((s for s in rep["sections"] if s["section"] == f["section"]), None)
    if sect is not None and "max_abs" in sect:
        out.update(max_abs=sect["max_abs"], max_rel=sect["max_rel"])
    if rep["structure"]:
        out["structure"] = rep["structure"]
    return out
