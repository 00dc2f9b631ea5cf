"""A verdict per GPU: PASS when its result matches the reference bit for bit (time and environment
fields apart, `coppelius diff`'s rules), FAIL naming the first differing section/step/row or how its
process ended, TIE when the node has no majority and no reference was given, ERROR when its run
was refused (could not run).

The reference is every known-good file given with `--expect` (a file, or each `*.bin` of a
directory: a result matching any of them passes), else the largest class of the node's completed
results (`coppelius.forensics.fleet.classify`); classes of equal largest size are a tie, reported
as such, never guessed."""
from __future__ import annotations

from pathlib import Path

from coppelius.staging.errors import EXIT_USER_ERROR

from coppelius.forensics.diff import compare
from coppelius.forensics.fleet import classify
from coppelius.node.targets import NodeRefused
from coppelius.results.reader import ResultFileError, read

PASS, FAIL, TIE, ERROR = "PASS", "FAIL", "TIE", "ERROR"


def references(expect) -> list[Path]:
    """The known-good files `--expect` names (refused when there are none)."""
    path = Path(expect)
    files = sorted(path.glob("*.bin")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise NodeRefused(f"--expect {expect}: no known-good result file there",
                          "name a result file, or a directory holding *.bin result files")
    for f in files:
        read(f)                             # an unreadable reference: ResultFileError, exit 2
    return files


def first_difference(rep: dict) -> dict:
    """Where a comparison first found a difference: section, where, structure."""
    f = rep.get("first") or {}
    out = {"section": f.get("section", "structure"),
           "where": f.get("where", "; ".join(rep["structure"]) or rep["verdict"])}
    for k in ("step", "row", "entry", "field", "column"):
        if k in f:
            out[k] = f[k]
    if rep["structure"]:
        out["structure"] = list(rep["structure"])
    return out


def _ended(child) -> dict | None:
    """A verdict from how the process ended alone (it did not complete), or None."""
    if child.returncode == 0 and not child.hung:
        return None
    if child.returncode == EXIT_USER_ERROR and not child.hung:
        last = child.stderr.strip().splitlines()[-1:] or [""]
        return {"verdict": ERROR, "reason": f"could not run: {last[0]}"}
    return {"verdict": FAIL, "reason": f"the run did not complete: {child.status}"}


def judge(children: list, expect=None) -> list[dict]:
    """One verdict dict per child, in order: verdict, reason, first_difference, reference."""
    return _judge([c.result for c in children], [_ended(c) for c in children], expect)


def judge_files(results: list, expect=None) -> list[dict]:
    """One verdict dict per result file, in order, as `judge` gives them for a node's children:
    for results a run left elsewhere (the fleet's job array, the Slurm node check), whose
    processes this one never saw, so a file that is missing or unreadable is a FAIL."""
    return _judge(list(results), [None] * len(results), expect)


def _judge(results: list, out: list, expect) -> list[dict]:
    """Fill `out` (a verdict already known from how a process ended, else None) by reading and
    comparing each result file."""
    readable = {}
    for i, path in enumerate(results):
        if out[i] is not None:
            continue
        try:
            readable[i] = read(path)
        except ResultFileError as e:
            out[i] = {"verdict": FAIL, "reason": f"its result file is unreadable: {e.message}"}
    if expect is not None:
        refs = [read(f) for f in references(expect)]
        for i, rf in readable.items():
            out[i] = _against(rf, refs, [str(r.path) for r in refs])
    elif readable:
        _majority(results, readable, out)
    for v in out:
        v.setdefault("first_difference", None)
        v.setdefault("reference", None)
    return out


def _against(rf, refs: list, names: list[str]) -> dict:
    reps = [compare(ref, rf) for ref in refs]
    for name, rep in zip(names, reps):
        if rep["same"]:
            return {"verdict": PASS, "reason": f"{rep['verdict']} with {name}", "reference": name}
    return {"verdict": FAIL, "reason": f"differs from {names[0]}",
            "first_difference": first_difference(reps[0]), "reference": names[0]}


def _majority(results: list, readable: dict, out: list) -> None:
    order = list(readable)
    fleet = classify([results[i] for i in order])
    sizes = [len(c["members"]) for c in fleet["classes"]]
    top = max(sizes)
    if sizes.count(top) > 1:
        why = (f"no majority: {len(sizes)} classes of results, {sizes.count(top)} of "
               f"{top} GPU(s) each; give --expect to name the known-good result")
        for i in order:
            out[i] = {"verdict": TIE, "reason": why}
        return
    winner = fleet["classes"][sizes.index(top)]
    ref_path = winner["members"][0]
    ref = readable[order[[str(results[i]) for i in order].index(ref_path)]]
    for i in order:
        out[i] = _against(readable[i], [ref], [f"majority ({top} of {len(order)})"])
