"""`coppelius diff A B [C ...]`: where result files differ — the regression check, pair or fleet.

Two files: section by section, the first difference (section, step, row), max abs/rel differences
per section, and whether they are bit-identical.  More files: the classes of identical results, one
row per class (SPEC §13).  A file joins the first class, in argument order, whose *first member* it
matches under the two-file rules; otherwise it opens a new class.  Membership is tested against
that one file, never against every member, so the classes depend only on the argument order.

`--across-backends` compares the numbers (forward and final logits, per-row losses, loss block,
predictions) under tolerances and lists the fields that name the backend and device apart.

Exit 0 when the files are the same (one class), 1 when they differ, 2 when one is unreadable.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from staging import records as R

from .cmd_verify import ROW_ATOL

ORDER = 30
EXIT_SAME, EXIT_DIFFERENT = 0, 1

# Fields that differ between two runs of the same bits: never make files "different"; listed apart.
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
# What necessarily differs between backends: the backend code, the device (name, compute capability;
# the driver version is an environment field already), and the digests of bits that follow from
# the numbers — the last published checkpoint, and the input checkpoint's payload (a continuation
# on each backend reads that backend's own checkpoint).  With --across-backends they are listed side
# by side and never count; without it they count (same PTX, same GPU, same bits).
IDENTITY_FIELDS = {
    "stat": ("payload_sha256",),
    "status": ("backend", "device_name", "compute_capability", "checkpoint_sha256"),
}
# Record fields that hold numbers of the computation: compared by `_compare_predictions`, under the
# tolerances, not bit by bit with their record.
NUMERIC_FIELDS = {"status": ("predictions",)}

# --across-backends defaults.  cuda and interpret run the same kernel sources on the same bf16
# operands; they accumulate fp32 in different orders (mma/wgmma vs numpy's matmul), so a sum moves
# by a few fp32 ulps, which now and then flips the bf16 rounding of a later operand by one bf16 ulp,
# and training carries those flips on.  The same kind of difference separates a backend from the
# numpy reference, for which `coppelius verify` budgets 5e-2 per row of cross-entropy and per
# logit (cmd_verify.ROW_ATOL = LOGIT_ATOL).  Measured, interpret vs the reference, tiny profile,
# `coppelius verify RESULT --steps 2`: forward logits max |Δ| 6.3e-4, per-row ce 7.1e-4 (step 0)
# and 6.9e-4 (step 1) — the budget is ≈ 70× that.  ATOL takes that budget; RTOL is one bf16 ulp
# relative (bf16 keeps 8 significant bits: an ulp is 2^-8 .. 2^-7 of the value), for large logits.
# Sized for short runs (tiny, a verify window): over thousands of steps two backends' trajectories
# drift apart further, and `--atol/--rtol` say how far is acceptable.  The absolute part is loose
# for the loss block's gradient and parameter windows (|x| ≪ 5e-2).
ACROSS_BACKENDS_ATOL = ROW_ATOL
ACROSS_BACKENDS_RTOL = 2.0 ** -7


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare result files: bit-identical, where they differ, or "
                       "the classes of a fleet",
                       description="Compare result files section by section. Time-dependent "
                       "fields (timestamps, wall times, stat times) and environment fields "
                       "(checkpoint inode and device, driver version) are reported apart and never "
                       "make files different. With more than two files: the classes of identical "
                       "results, each file tested against each class's first member in argument "
                       "order. Exit 0 same (one class), 1 different, 2 unreadable.")
    p.add_argument("a", metavar="A", help="first result file (the reference of class 1)")
    p.add_argument("b", metavar="B", help="second result file")
    p.add_argument("more", metavar="C", nargs="*", help="more result files: a fleet")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for numeric sections (default 0: bits must match; "
                   f"with --across-backends {ACROSS_BACKENDS_ATOL:g})")
    p.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for numeric sections (default 0: bits must match; "
                   f"with --across-backends {ACROSS_BACKENDS_RTOL:g}, one bf16 ulp)")
    p.add_argument("--across-backends", action="store_true",
                   help="compare the numbers under the tolerances; backend, device, compute "
                   "capability, driver, PTX target and checkpoint digests are listed side by side "
                   "and never count")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def tolerances(args) -> tuple[float, float]:
    """(atol, rtol): what was asked, else the --across-backends defaults, else exact."""
    from .errors import UserError
    atol = args.atol if args.atol is not None else \
        (ACROSS_BACKENDS_ATOL if args.across_backends else 0.0)
    rtol = args.rtol if args.rtol is not None else \
        (ACROSS_BACKENDS_RTOL if args.across_backends else 0.0)
    if atol < 0 or rtol < 0 or not np.isfinite([atol, rtol]).all():
        raise UserError(f"tolerances must be finite and ≥ 0 (got --atol {atol}, --rtol {rtol})",
                        "pass finite --atol/--rtol ≥ 0; 0 means the bits must match")
    return atol, rtol


def run(args) -> int:
    atol, rtol = tolerances(args)
    paths = [args.a, args.b, *args.more]
    fleet = classify(paths, atol, rtol, args.across_backends)
    if len(paths) == 2:                      # the two-file report, with the classes beside it
        report = dict(fleet["reports"][1], classes=fleet["classes"])
        if args.json:
            _dump(report)
        else:
            render(report)
        return EXIT_SAME if report["same"] else EXIT_DIFFERENT
    del fleet["reports"]
    if args.json:
        _dump(fleet)
    else:
        render_fleet(fleet)
    return EXIT_SAME if fleet["same"] else EXIT_DIFFERENT


def _dump(obj) -> None:
    json.dump(_finite(obj), sys.stdout, allow_nan=False)
    sys.stdout.write("\n")


def _finite(x):
    """JSON has no NaN or infinity: they become null."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


# --------------------------------------------------------------------------------------- fleet
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
    from .result_file import read
    classes, entries, reports = [], [], []        # classes: (first ResultFile, its entry)
    for path in paths:
        rf = read(path)                           # ResultFileError names the path: exit 2
        member = dict(_describe(rf), **identity(rf))
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


# ------------------------------------------------------------------------------------ identity
def identity(rf) -> dict:
    """What names the backend and the device of one result file, as plain values."""
    from .result_file import plain
    st = rf.status
    code, cc = int(st["backend"]), int(st["compute_capability"])
    return {"backend": R.BACKENDS.get(code, f"code {code}"), "backend_code": code,
            "device_name": plain(st["device_name"]), "compute_capability": cc,
            "driver_version": int(st["driver_version"]), "ptx_target": ptx_target(code, cc),
            "checkpoint_sha256": plain(st["checkpoint_sha256"]),
            "payload_sha256": plain(rf.stat["payload_sha256"])}


def ptx_target(backend_code: int, compute_capability: int) -> str | None:
    """The PTX target the cuda backend loads for this compute capability; None for the interpreter.

    The result file does not record it (the status block has no field for it); the choice is a pure
    function of the compute capability, `host.backend_cuda.choose_target`, so it is derived here.
    """
    if backend_code != R.BACKEND_CUDA:
        return None
    from .backend import BackendUnavailable
    from .backend_cuda import choose_target
    try:
        return choose_target(compute_capability)
    except BackendUnavailable:
        return None


def _identity_rows(a: dict, b: dict) -> list[dict]:
    """Side by side: every identity field of A and B, whether it differs."""
    keys = ("backend", "device_name", "compute_capability", "driver_version", "ptx_target",
            "checkpoint_sha256", "payload_sha256")
    return [{"field": k, "a": a[k], "b": b[k], "differs": a[k] != b[k]} for k in keys]


# ---------------------------------------------------------------------------------- comparison
def compare(a, b, atol: float = 0.0, rtol: float = 0.0, across_backends: bool = False,
            stop_early: bool = False) -> dict:
    """Section-by-section comparison of two ResultFiles, in file order.

    `stop_early`: return at the first difference beyond tolerance, verdict "different", with the
    sections and counts found so far (a fleet's membership test); a "same" verdict is always full.
    """
    from staging.result_sections import SECTIONS
    ia, ib = identity(a), identity(b)
    rep = {"a": _describe(a), "b": _describe(b), "atol": atol, "rtol": rtol,
           "across_backends": across_backends, "identity": _identity_rows(ia, ib),
           "structure": [], "sections": [], "time_fields": [], "environment_fields": [],
           "identity_fields": [], "first": None}
    if _bit_identical(a, b):
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

    first = first_bad = None                      # the first difference, the first beyond tolerance
    for section in SECTIONS:
        name = section.name
        if section.record is None:                  # fp32 words
            found = [_compare_floats(name, a.section(name), b.section(name), atol, rtol, a,
                                     stop_early)]
            if name == "steps" and found[0]["first"] is None and a.steps != b.steps:
                k = min(a.steps, b.steps)       # the common steps agree: the first extra one
                found[0]["first"] = {"step": k, "row": 0, "where": f"step {k:,}: only "
                                     f"{'A' if a.steps > b.steps else 'B'} has it"}
        else:
            found = [_compare_records(name, a, b, rep, across_backends)]
            if name in NUMERIC_FIELDS:
                found.append(_compare_predictions(a, b, atol, rtol))
        for s in found:
            rep["sections"].append(s)
            if s["first"] is None:
                continue
            if first is None:
                first = dict(s["first"], section=s["section"])
            if first_bad is None and not s["first"].get("within_tolerance", False):
                first_bad = dict(s["first"], section=s["section"])
        if stop_early and (first_bad or rep["structure"]):
            rep.update(first=first_bad or first, verdict="different", same=False, stopped=name)
            return rep
    rep["first"] = first_bad or first

    differing = rep["structure"] or any(s["beyond_tolerance"] for s in rep["sections"])
    any_bits = any(s["differing"] for s in rep["sections"])
    if differing:
        verdict = "different"
    elif any_bits:
        verdict = "within tolerance"
    elif rep["identity_fields"]:
        verdict = "identical except time-dependent, environment and identity fields"
    else:
        verdict = "identical except time-dependent and environment fields"
    rep.update(verdict=verdict, same=not differing)
    rep["timing"] = {"A_device_step_ms_p50": _p50_ms(a), "B_device_step_ms_p50": _p50_ms(b)}
    return rep


def _bit_identical(a, b) -> bool:
    """The whole files equal; the 160-byte status block first (its wall time differs between any
    two runs), so that a fleet's comparisons do not pay a full extra pass for the fast path."""
    if a.size != b.size:
        return False
    off, size = a.offsets["status"]
    if not np.array_equal(a.raw[off:off + size], b.raw[off:off + size]):
        return False
    return bool(np.array_equal(a.raw, b.raw))


def _describe(rf) -> dict:
    return {"path": rf.path, "profile": rf.profile.name, "outcome": rf.outcome,
            "c0": int(rf.status["c0"]), "steps": rf.steps, "issues": rf.issues, "size": rf.size}


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
    return {"column": index[0]}, f"row {PREDICTION_ROWS[-1]} logits, token {index[0]}"


CHUNK_WORDS = 1 << 20      # compare 4 MiB at a time: memory stays flat even when every word differs


def _compare_floats(name, fa, fb, atol, rtol, rf, stop_early: bool = False) -> dict:
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
            if stop_early:
                break
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


def _compare_predictions(a, b, atol: float, rtol: float) -> dict:
    """status.predictions row by row: the argmax token and its valid flag.

    Bits must match without a tolerance.  With one, a different token is within it when the two
    tokens' logits lie within the tolerance of each other in both files — a near tie that another
    accumulation order may break either way.  Only the last prediction row's logits are in the file
    (the final part, or the forward part when the final submission never ran); a different token in
    another row cannot be judged and counts.
    """
    from plan.profiles import PREDICTION_ROWS
    pa = np.asarray(a.status["predictions"]).tolist()       # (3, {token, valid})
    pb = np.asarray(b.status["predictions"]).tolist()
    out = {"section": "predictions", "differing": 0, "beyond_tolerance": 0, "fields": [],
           "first": None}
    for i, row in enumerate(PREDICTION_ROWS):
        (ta, va), (tb, vb) = pa[i], pb[i]
        if (ta, va) == (tb, vb):
            continue
        tie = (va == vb and (atol > 0 or rtol > 0) and row == PREDICTION_ROWS[-1]
               and _near_tie(_last_row_logits(a), _last_row_logits(b), ta, tb, atol, rtol))
        out["differing"] += 1
        out["beyond_tolerance"] += int(not tie)
        if out["first"] is None or (not tie and out["first"]["within_tolerance"]):
            valid = f" (valid A {va}, B {vb})" if va != vb else ""
            why = ", a near tie" if tie else ""
            out["first"] = {"row": row, "where": f"row {row} prediction{valid}{why}", "a": ta,
                            "b": tb, "within_tolerance": bool(tie)}
    return out


def _last_row_logits(rf) -> np.ndarray:
    """(V,) f32: the logits the last prediction row was taken from."""
    from staging import layout as L
    ts = rf.timestamps
    final_seen = ((ts["submission"] == L.SUBMISSION_FINAL)
                  & ((ts["flags"] & R.FLAG_FENCE_OBSERVED) != 0)).any()
    return rf.final if final_seen else rf.forward[-1]


def _near_tie(la, lb, ta: int, tb: int, atol: float, rtol: float) -> bool:
    """Each file's argmax logit within the tolerance of the other file's token, in both files."""
    if max(ta, tb) >= la.size:
        return False
    ga, gb = float(la[ta]) - float(la[tb]), float(lb[tb]) - float(lb[ta])
    return bool(ga <= atol + rtol * abs(float(la[ta])) and gb <= atol + rtol * abs(float(lb[tb])))


def _record_arrays(rf, name):
    """(n, itemsize) u8 bytes and the structured view of a record section."""
    from staging.result_sections import SECTION
    rec = SECTION[name].record
    off, size = rf.offsets[name]
    n = size // rec.itemsize
    raw = rf.raw[off:off + size].reshape(n, rec.itemsize)
    return raw, rec.view(rf.raw, n, off), rec.dtype


def _compare_records(name, a, b, rep, across_backends: bool = False) -> dict:
    """Bitwise comparison field by field; time and environment fields (and with --across-backends
    identity fields) are listed apart; numeric fields are compared elsewhere."""
    from staging import layout as L
    from .result_file import plain
    ra, sa, dtype = _record_arrays(a, name)
    rb, sb, _ = _record_arrays(b, name)
    n = min(len(ra), len(rb))
    out = {"section": name, "differing": 0, "beyond_tolerance": 0, "fields": [], "first": None}
    apart = {"time_fields": TIME_FIELDS.get(name, ()),
             "environment_fields": ENVIRONMENT_FIELDS.get(name, ()),
             "identity_fields": IDENTITY_FIELDS.get(name, ()) if across_backends else ()}
    first_entry = None
    for field in dtype.names:
        if field in NUMERIC_FIELDS.get(name, ()):
            continue
        ftype, foff = dtype.fields[field][:2]
        rows = np.flatnonzero((ra[:n, foff:foff + ftype.itemsize]
                               != rb[:n, foff:foff + ftype.itemsize]).any(axis=1))
        if not rows.size:
            continue
        label = f"{name}.{field}" + (f" ({rows.size:,} entries)" if name == "timestamps" else "")
        kind = next((k for k, fields in apart.items() if field in fields), None)
        if kind is not None:
            rep[kind].append(label)
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
WIDTH_PIPED = 160          # a table written to a file or a pipe is not wrapped at 80 columns


def _console():
    from rich.console import Console
    c = Console(highlight=False)
    if not c.is_terminal:
        c.width = max(c.width, WIDTH_PIPED)
    return c


def _cc(cc: int) -> str:
    return f"{cc // 10}.{cc % 10}" if cc else "—"


def _driver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "—"


def _shown(field: str, value) -> str:
    """An identity value as a table shows it."""
    if value is None or value == "":
        return "—"
    if field == "compute_capability":
        return _cc(value)
    if field == "driver_version":
        return _driver(value)
    if field.endswith("sha256"):
        return "zeros (none)" if set(value) == {"0"} else value[:16] + "…"
    return str(value)


def _rules(rep: dict) -> str:
    tol = f"atol {rep['atol']:g}, rtol {rep['rtol']:g}"
    if rep["across_backends"]:
        return (f"across backends: numbers within {tol}; identity, time-dependent and environment "
                "fields never count")
    numbers = f"numbers within {tol}" if rep["atol"] or rep["rtol"] else "bits must match"
    return f"{numbers}; time-dependent and environment fields never count"


def render(rep: dict) -> None:
    from rich import box
    from rich.table import Table

    c = _console()
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
    if rep["across_backends"]:
        t = Table(title="identity (listed apart, never counted)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("field", "A", "B", ""):
            t.add_column(col)
        for r in rep["identity"]:
            t.add_row(r["field"], _shown(r["field"], r["a"]), _shown(r["field"], r["b"]),
                      "differs" if r["differs"] else "")
        c.print(t)
    if rep["time_fields"]:
        c.print("time-dependent fields that differ (never count): " + ", ".join(rep["time_fields"]))
    if rep["environment_fields"]:
        c.print("environment fields that differ (never count): "
                + ", ".join(rep["environment_fields"]))
    if rep["identity_fields"]:
        c.print("identity fields that differ (never count across backends): "
                + ", ".join(rep["identity_fields"]))
    tm = rep.get("timing")
    if tm and tm["A_device_step_ms_p50"] is not None and tm["B_device_step_ms_p50"] is not None:
        c.print(f"device time per update step p50: A {tm['A_device_step_ms_p50']:.3f} ms, "
                f"B {tm['B_device_step_ms_p50']:.3f} ms")


def _cell(files: list[dict], field: str) -> str:
    """The distinct values of one field among a class's members, one a line, with counts when
    they vary."""
    shown = [_shown(field, m[field]) for m in files]
    distinct = list(dict.fromkeys(shown))
    if len(distinct) == 1:
        return distinct[0]
    return "\n".join(f"{v} ×{shown.count(v)}" for v in distinct)


def _difference_text(d: dict | None) -> str:
    if d is None:
        return "(reference)"
    text = f"{d['section']}: {d['where']}"
    if "max_abs" in d:
        text += f" (max abs {d['max_abs']:.3g}, rel {d['max_rel']:.3g})"
    return text


def render_fleet(fleet: dict) -> None:
    """One row per class (members' identity, where it first differs from class 1), then the
    members of each class by name."""
    from rich import box
    from rich.table import Table

    c = _console()
    n, k = len(fleet["files"]), len(fleet["classes"])
    colour = "green" if fleet["same"] else "red"
    verdict = f"all {n} in one class" if k == 1 else f"{k} classes"
    c.print(f"{n} result files: [bold {colour}]{verdict}[/bold {colour}] ({_rules(fleet)})")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("class", "files", "device", "cc", "driver", "PTX", "backend", "outcome", "c0",
                "first difference from class 1"):
        t.add_column(col, justify="right" if col in ("class", "files", "cc", "driver", "c0")
                     else "left")
    for cls in fleet["classes"]:
        files = cls["member_details"]
        t.add_row(str(cls["class"]), str(len(files)), _cell(files, "device_name"),
                  _cell(files, "compute_capability"), _cell(files, "driver_version"),
                  _cell(files, "ptx_target"), _cell(files, "backend"), _cell(files, "outcome"),
                  _cell(files, "c0"), _difference_text(cls["first_difference"]))
    c.print(t)
    for cls in fleet["classes"]:
        c.print(f"class {cls['class']}: " + ", ".join(cls["members"]))
