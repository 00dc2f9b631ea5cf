"""With `--digests` or `--soak K`, each GPU's verdict gains its digests' reading (docs/NODE.md):
a FAIL names the first divergent kernel of the digested update against the reference GPU's
digests (`coppelius bisect`'s machinery, bitwise), and a soak's repetition that differs from the
first (`coppelius soak`) is a transient fault, which fails a GPU whose result otherwise passed.
A GPU that differs from the reference in every repetition shows as a first divergent kernel
with no transient fault: a persistent one."""
from __future__ import annotations

from coppelius.results.digests import DigestsError
from coppelius.results.digests import read as read_digests

from coppelius.forensics.bisect import Rules, bisect, soak
from coppelius.node.verdicts import FAIL, PASS


def add_digests(children: list, verdicts: list[dict], soaking: bool) -> None:
    """Fill each verdict's "kernel" (first divergent launch vs the reference) and "soak"."""
    docs = {}
    for i, c in enumerate(children):
        try:
            docs[i] = read_digests(c.digests)
        except (DigestsError, OSError):
            continue
    ref = next((i for i, v in enumerate(verdicts) if v["verdict"] == PASS and i in docs), None)
    for i, v in enumerate(verdicts):
        v["kernel"], v["soak"] = None, None
        if i not in docs:
            continue
        if v["verdict"] == FAIL and ref is not None:
            v["kernel"] = _first_kernel(docs[ref], docs[i], children[ref], children[i])
        if soaking:
            v["soak"] = _soak(docs[i], children[i], v)


def _first_kernel(a: dict, b: dict, ca, cb) -> dict:
    try:
        found = bisect(a, b, Rules(), str(ca.digests), str(cb.digests))
    except DigestsError as e:
        return {"launch": None, "why": e.message}
    f = found["first"]
    if f is None:
        return {"launch": None, "why": f"no launch of update step {a['step']} differs"}
    return {"launch": f["index"], "label": f["label"], "kernel": f["kernel"],
            "verdict": f["verdict"], "regions": [r["name"] for r in f["regions"]]}


def _soak(doc: dict, child, verdict: dict) -> dict:
    try:
        rep = soak(doc, child.digests)
    except DigestsError as e:
        return {"verdict": e.message, "transient": []}
    faults = [{k: f[k] for k in ("repetition", "launch", "label", "kernel")}
              | {"regions": [r["name"] for r in f["regions"]]} for f in rep["transient"]]
    if faults and verdict["verdict"] == PASS:
        f = faults[0]
        verdict["verdict"] = FAIL
        verdict["reason"] = (f"transient fault: repetition {f['repetition']} of "
                             f"{rep['repetitions']}, launch #{f['launch']} {f['label']} "
                             f"({', '.join(f['regions'])})")
    return {"repetitions": rep["repetitions"], "verdict": rep["verdict"], "transient": faults}
