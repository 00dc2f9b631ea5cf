"""`coppelius diff A B [--atol X --rtol Y]`: where two result files first differ — the regression check.

Exit 0 when the files are the same (bit-identical, or equal up to time-dependent and environment
fields, or within the tolerance), 1 when they differ, 2 when either is unreadable.
"""
from __future__ import annotations

import json
import sys

import numpy as np

ORDER = 30
EXIT_SAME, EXIT_DIFFERENT = 0, 1

# Fields that differ between two runs of the same bits: never make files "different", reported apart.
TIME_FIELDS = {
    "stat": ("st_atime_ns", "st_mtime_ns", "st_ctime_ns"),
    "semaphores": ("final_timestamp", "prelaunch_timestamp"),
    "error_notifier": ("time_ns",),
    "status": ("wall_ns",),
    "timestamps": ("host_issue_ns", "device_prelaunch_ns", "device_final_ns", "host_fence_ns",
                   "host_wall_issue_ns"),
}
# Where the checkpoint input lives and which driver ran: the machine, not the computation.
ENVIRONMENT_FIELDS = {
    "stat": ("st_dev", "st_ino", "st_mode", "st_uid", "st_gid", "st_blocks", "st_blksize"),
    "status": ("driver_version",),
}


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two result files: bit-identical, or where they differ",
                       description="Compare two result files section by section. Time-dependent "
                       "fields (timestamps, wall times, stat times) and environment fields "
                       "(checkpoint inode and device, driver version) are reported apart and never "
                       "make the files different. Exit 0 same, 1 different, 2 unreadable.")
    p.add_argument("a", metavar="A", help="first result file")
    p.add_argument("b", metavar="B", help="second result file")
    p.add_argument("--atol", type=float, default=0.0,
                   help="absolute tolerance for float sections (default 0: bits must match)")
    p.add_argument("--rtol", type=float, default=0.0,
                   help="relative tolerance for float sections (default 0: bits must match)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from .errors import UserError
    from .result_file import read
    if args.atol < 0 or args.rtol < 0 or not np.isfinite([args.atol, args.rtol]).all():
        raise UserError(f"tolerances must be finite and ≥ 0 (got --atol {args.atol}, "
                        f"--rtol {args.rtol})")
    a, b = read(args.a), read(args.b)
    report = compare(a, b, args.atol, args.rtol)
    if args.json:
        json.dump(_finite(report), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        render(report)
    return EXIT_SAME if report["same"] else EXIT_DIFFERENT


def _finite(x):
    """JSON has no NaN or infinity: they become null."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


# ---------------------------------------------------------------------------------- comparison
def compare(a, b, atol: float = 0.0, rtol: float = 0.0) -> dict:
    """Section-by-section comparison of two ResultFiles, in file order."""
    from staging.result_sections import SECTIONS
    rep = {"a": _describe(a), "b": _describe(b), "atol": atol, "rtol": rtol,
           "structure": [], "sections": [], "time_fields": [], "environment_fields": [],
           "first": None}
    if a.size == b.size and np.array_equal(a.raw, b.raw):
        rep.update(verdict="bit-identical", same=True)
        return rep
    if a.profile.name != b.profile.name:
        rep["structure"].append(f"profiles differ: A {a.profile.name}, B {b.profile.name}")
        rep.update(verdict="different", same=False)
        return rep
    if a.steps != b.steps:
        rep["structure"].append(f"step windows differ: A {a.steps:,}, B {b.steps:,}")
    if a.issues != b.issues:
        rep["structure"].append(f"timestamp entries differ: A {a.issues:,}, B {b.issues:,}")

    for section in SECTIONS:
        name = section.name
        if section.record is None:                  # fp32 words
            s = _compare_floats(name, a.section(name), b.section(name), atol, rtol, a)
            if name == "steps" and s["first"] is None and a.steps != b.steps:
                k = min(a.steps, b.steps)       # the common steps agree: the first extra one
                s["first"] = {"step": k, "row": 0, "where": f"step {k:,}: only "
                              f"{'A' if a.steps > b.steps else 'B'} has it"}
        else:
            s = _compare_records(name, a, b, rep)
        rep["sections"].append(s)
        if rep["first"] is None and s["first"] is not None:
            rep["first"] = dict(s["first"], section=name)

    differing = rep["structure"] or any(s["beyond_tolerance"] for s in rep["sections"])
    any_bits = any(s["differing"] for s in rep["sections"])
    if differing:
        verdict = "different"
    elif any_bits:
        verdict = "within tolerance"
    else:
        verdict = "identical except time-dependent and environment fields"
    rep.update(verdict=verdict, same=not differing)
    rep["timing"] = {"A_device_step_ms_p50": _p50_ms(a), "B_device_step_ms_p50": _p50_ms(b)}
    return rep


def _describe(rf) -> dict:
    return {"path": rf.path, "profile": rf.profile.name, "outcome": rf.outcome,
            "steps": rf.steps, "issues": rf.issues, "size": rf.size}


def _p50_ms(rf):
    d = rf.device_step_ns()
    return float(np.median(d)) / 1e6 if d.size else None


def _where(section: str, index: tuple, rf) -> tuple[dict, str]:
    """Name a float element: step and row for the loss windows, row and column elsewhere."""
    from plan.profiles import PREDICTION_ROWS
    if section == "steps":
        step, row = index
        return {"step": step, "row": row}, f"step {step:,}, row {row}"
    if section == "forward":
        r, col = index
        return ({"row": PREDICTION_ROWS[r], "column": col},
                f"row {PREDICTION_ROWS[r]} logits, token {col}")
    if section == "loss_block":
        w, word = index
        return {"window": w, "word": word}, f"window w{w}, word {word}"
    return {"column": index[0]}, f"row 1023 logits, token {index[0]}"


CHUNK_WORDS = 1 << 20      # compare 4 MiB at a time: memory stays flat even when every word differs


def _compare_floats(name, fa, fb, atol, rtol, rf) -> dict:
    rows = min(fa.shape[0], fb.shape[0])
    fa, fb = fa[:rows], fb[:rows]                        # a shorter run: compare the common steps
    flat_a, flat_b = fa.reshape(-1), fb.reshape(-1)      # (n,) views
    exact = atol == 0 and rtol == 0
    out = {"section": name, "differing": 0, "beyond_tolerance": 0,
           "max_abs": 0.0, "max_rel": 0.0, "first": None}
    first = first_bad = None                             # (flat index, a, b)
    for start in range(0, flat_a.size, CHUNK_WORDS):
        ca, cb = flat_a[start:start + CHUNK_WORDS], flat_b[start:start + CHUNK_WORDS]
        idx = np.flatnonzero(ca.view(np.uint32) != cb.view(np.uint32))   # differing words
        if not idx.size:
            continue
        va, vb = ca[idx].astype(np.float64), cb[idx].astype(np.float64)
        both_nan = np.isnan(va) & np.isnan(vb)
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(va - vb)
            d = np.where(both_nan, 0.0, np.where(np.isnan(d), np.inf, d))
            scale = np.maximum(np.abs(va), np.abs(vb))
            rel = np.where(d == 0, 0.0, d / np.where(scale == 0, 1.0, scale))
            rel = np.where(np.isnan(rel), np.inf, rel)
            bad = np.ones(idx.size, bool) if exact else \
                ~(both_nan | (d <= atol + rtol * np.abs(vb)))
        out["differing"] += int(idx.size)
        out["beyond_tolerance"] += int(bad.sum())
        out["max_abs"] = max(out["max_abs"], float(d.max()))
        out["max_rel"] = max(out["max_rel"], float(rel.max()))
        if first is None:
            first = (start + int(idx[0]), va[0], vb[0])
        if first_bad is None and bad.any():
            k = int(np.argmax(bad))
            first_bad = (start + int(idx[k]), va[k], vb[k])
    pick = first_bad or first
    if pick is None:
        return out
    flat, a, b = pick
    index = tuple(int(i) for i in np.unravel_index(flat, fa.shape))
    loc, text = _where(name, index, rf)
    out["first"] = dict(loc, where=text, a=float(a), b=float(b),
                        a_bits=f"{int(flat_a[flat:flat + 1].view(np.uint32)[0]):#010x}",
                        b_bits=f"{int(flat_b[flat:flat + 1].view(np.uint32)[0]):#010x}",
                        within_tolerance=first_bad is None)
    return out


def _record_arrays(rf, name):
    """(n, itemsize) u8 bytes and the structured view of a record section."""
    from staging.result_sections import SECTION
    rec = SECTION[name].record
    off, size = rf.offsets[name]
    n = size // rec.itemsize
    raw = rf.raw[off:off + size].reshape(n, rec.itemsize)
    return raw, rec.view(rf.raw, n, off), rec.dtype


def _compare_records(name, a, b, rep) -> dict:
    """Bitwise comparison field by field; time and environment fields are listed apart."""
    from staging import layout as L
    from .result_file import plain
    ra, sa, dtype = _record_arrays(a, name)
    rb, sb, _ = _record_arrays(b, name)
    n = min(len(ra), len(rb))
    out = {"section": name, "differing": 0, "beyond_tolerance": 0, "fields": [], "first": None}
    first_entry = None
    for field in dtype.names:
        ftype, foff = dtype.fields[field][:2]
        rows = np.flatnonzero((ra[:n, foff:foff + ftype.itemsize]
                               != rb[:n, foff:foff + ftype.itemsize]).any(axis=1))
        if not rows.size:
            continue
        label = f"{name}.{field}" + (f" ({rows.size:,} entries)" if name == "timestamps" else "")
        if field in TIME_FIELDS.get(name, ()):
            rep["time_fields"].append(label)
            continue
        if field in ENVIRONMENT_FIELDS.get(name, ()):
            rep["environment_fields"].append(label)
            continue
        out["differing"] += int(rows.size)
        out["beyond_tolerance"] += int(rows.size)
        out["fields"].append(label)
        k = int(rows[0])
        if first_entry is None or k < first_entry[0]:
            if name == "timestamps":
                where = f"entry {k:,} (sequence {k + 1:,}), field {field}"
            elif name == "semaphores":
                where = f"submission {L.SUBMISSIONS[k]}, field {field}"
            else:
                where = f"field {field}"
            first_entry = (k, {"entry": k, "field": field, "where": where,
                               "a": plain(sa[k][field]), "b": plain(sb[k][field])})
    if first_entry:
        out["first"] = first_entry[1]
    return out


# ------------------------------------------------------------------------------------- render
def render(rep: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False)
    for k in ("a", "b"):
        d = rep[k]
        c.print(f"{k.upper()}: {d['path']} ({d['profile']}, {d['outcome']}, {d['steps']:,} steps, "
                f"{d['size']:,} bytes)")
    colour = "green" if rep["same"] else "red"
    tol = f" (atol {rep['atol']:g}, rtol {rep['rtol']:g})" if rep["atol"] or rep["rtol"] else ""
    c.print(f"[bold {colour}]{rep['verdict']}[/bold {colour}]{tol}")
    for s in rep["structure"]:
        c.print(f"  {s}")
    f = rep["first"]
    if f is not None:
        vals = ""
        if "a" in f:
            fmt = (lambda v: f"{v:.9g}") if "a_bits" in f else repr
            vals = f": A {fmt(f['a'])}, B {fmt(f['b'])}"
            if "a_bits" in f:
                vals += f" (bits {f['a_bits']} vs {f['b_bits']})"
        c.print(f"first difference: section {f['section']}, {f['where']}{vals}")
    if rep["sections"]:
        tolerant = bool(rep["atol"] or rep["rtol"])
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        cols = ("section", "differing") + (("beyond tol.",) if tolerant else ()) + \
            ("max abs", "max rel", "first")
        for col in cols:
            t.add_column(col, justify="left" if col in ("section", "first") else "right")
        for s in rep["sections"]:
            first = "" if s["first"] is None else s["first"]["where"]
            row = [s["section"], f"{s['differing']:,}"]
            if tolerant:
                row.append(f"{s['beyond_tolerance']:,}")
            if "max_abs" in s:
                row += [f"{s['max_abs']:.3g}", f"{s['max_rel']:.3g}", first]
            else:
                row += ["", "", first if not s["fields"] else
                        first + "; fields " + ", ".join(f.split(".", 1)[1] for f in s["fields"])]
            t.add_row(*row)
        c.print(t)
    if rep["time_fields"]:
        c.print("time-dependent fields that differ (never count): " + ", ".join(rep["time_fields"]))
    if rep["environment_fields"]:
        c.print("environment fields that differ (never count): "
                + ", ".join(rep["environment_fields"]))
    tm = rep.get("timing")
    if tm and tm["A_device_step_ms_p50"] is not None and tm["B_device_step_ms_p50"] is not None:
        c.print(f"device time per update step p50: A {tm['A_device_step_ms_p50']:.3f} ms, "
                f"B {tm['B_device_step_ms_p50']:.3f} ms")
