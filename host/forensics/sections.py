"""One section of two result files compared: fp32 words, the predictions, or records field by field.

Each function returns the section's entry of a `coppelius.forensics.diff.compare` report: how many elements
differ, how many beyond the tolerance, and the first difference named the way a reader looks it
up (step and row, entry and field).  What counts is decided by the caller (`coppelius.forensics.diff`'s field
tables); these functions only count and locate.
"""
from __future__ import annotations

import numpy as np

from coppelius.plan.profiles import PREDICTION_ROWS
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging.result_sections import SECTION

from coppelius.results.reader import STATUS_FIELDS, plain

CHUNK_WORDS = 1 << 20      # compare 4 MiB at a time: memory stays flat even when every word differs


# ------------------------------------------------------------------------------------ fp32 words
def compare_floats(name, fa, fb, atol, rtol, rf, stop_early: bool = False) -> dict:
    """fp32 sections (forward, steps, loss_block, final) word by word, in chunks of CHUNK_WORDS."""
    rows = min(fa.shape[0], fb.shape[0])
    fa, fb = fa[:rows], fb[:rows]                        # a shorter run: compare the common steps
    flat_a, flat_b = fa.reshape(-1), fb.reshape(-1)      # (n,) views
    out = {"section": name, "differing": 0, "beyond_tolerance": 0,
           "max_abs": 0.0, "max_rel": 0.0, "first": None}
    first = first_bad = None                             # (flat index, a, b)
    for start in range(0, flat_a.size, CHUNK_WORDS):
        ca, cb = flat_a[start:start + CHUNK_WORDS], flat_b[start:start + CHUNK_WORDS]
        idx = np.flatnonzero(ca.view(np.uint32) != cb.view(np.uint32))   # differing words
        if not idx.size:
            continue
        va, vb = ca[idx].astype(np.float64), cb[idx].astype(np.float64)
        d, rel, bad = _differences(va, vb, atol, rtol)
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
    if pick is not None:
        out["first"] = _first_float(name, pick, fa.shape, flat_a, flat_b, rf,
                                    within_tolerance=first_bad is None)
    return out


def _differences(va, vb, atol: float, rtol: float):
    """(abs, rel, beyond tolerance) of differing words, (n,) f64 each: NaN against NaN is no
    difference, NaN against a number is an infinite one."""
    exact = atol == 0 and rtol == 0
    both_nan = np.isnan(va) & np.isnan(vb)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(va - vb)
        d = np.where(both_nan, 0.0, np.where(np.isnan(d), np.inf, d))
        scale = np.maximum(np.abs(va), np.abs(vb))
        rel = np.where(d == 0, 0.0, d / np.where(scale == 0, 1.0, scale))
        rel = np.where(np.isnan(rel), np.inf, rel)
        bad = np.ones(va.size, bool) if exact else \
            ~(both_nan | (d <= atol + rtol * np.abs(vb)))
    return d, rel, bad


def _first_float(name, pick, shape, flat_a, flat_b, rf, within_tolerance: bool) -> dict:
    """The picked word (flat index, a, b) named by its place, with both files' bits."""
    flat, a, b = pick
    index = tuple(int(i) for i in np.unravel_index(flat, shape))
    loc, text = _where(name, index, rf)
    return dict(loc, where=text, a=float(a), b=float(b),
                a_bits=f"{int(flat_a[flat:flat + 1].view(np.uint32)[0]):#010x}",
                b_bits=f"{int(flat_b[flat:flat + 1].view(np.uint32)[0]):#010x}",
                within_tolerance=within_tolerance)


def _where(section: str, index: tuple, rf) -> tuple[dict, str]:
    """Name a float element: step and row for the loss windows, row and column elsewhere."""
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


# ----------------------------------------------------------------------------------- predictions
def compare_predictions(a, b, atol: float, rtol: float) -> dict:
    """status.predictions row by row: the argmax token and its valid flag.

    Bits must match without a tolerance.  With one, a different token is within it when the two
    tokens' logits lie within the tolerance of each other in both files — a near tie that another
    accumulation order may break either way.  Only the last prediction row's logits are in the file
    (the final part, or the forward part when the final submission never ran); a different token in
    another row cannot be judged and counts.
    """
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


# --------------------------------------------------------------------------------------- records
def compare_records(name, a, b, apart: dict, skip: tuple = ()) -> tuple[dict, dict]:
    """Bitwise comparison field by field, in the record's field order.

    `apart`: {report key: fields} whose differences are only listed (time, environment, identity);
    `skip`: fields compared elsewhere.  Returns the section entry and {report key: [labels]}.
    """
    ra, sa, dtype = _record_arrays(a, name)
    rb, sb, _ = _record_arrays(b, name)
    if name == "status" and a.status_version != b.status_version:
        ra, rb = _digest_prefixes(ra, dtype), _digest_prefixes(rb, dtype)
    n = min(len(ra), len(rb))
    out = {"section": name, "differing": 0, "beyond_tolerance": 0, "fields": [], "first": None}
    listed = {kind: [] for kind in apart}
    first_entry = None
    for field in dtype.names:
        if field in skip:
            continue
        ftype, foff = dtype.fields[field][:2]
        rows = np.flatnonzero((ra[:n, foff:foff + ftype.itemsize]
                               != rb[:n, foff:foff + ftype.itemsize]).any(axis=1))
        if not rows.size:
            continue
        label = f"{name}.{field}" + (f" ({rows.size:,} entries)" if name == "timestamps" else "")
        kind = next((k for k, fields in apart.items() if field in fields), None)
        if kind is not None:
            listed[kind].append(label)
            continue
        out["differing"] += int(rows.size)
        out["beyond_tolerance"] += int(rows.size)
        out["fields"].append(label)
        k = int(rows[0])
        if first_entry is None or k < first_entry[0]:
            first_entry = (k, {"entry": k, "field": field, "where": _entry_where(name, k, field),
                               "a": plain(sa[k][field]), "b": plain(sb[k][field])})
    if first_entry:
        out["first"] = first_entry[1]
    return out, listed


def _record_arrays(rf, name):
    """(n, itemsize) u8 bytes and the structured view of a record section; the status block as
    the reader gives it for either version (STATUS_FIELDS), so that version 1 and 2 compare."""
    if name == "status":
        one = np.array(rf.status, STATUS_FIELDS.dtype).reshape(1)
        return one.view(np.uint8).reshape(1, STATUS_FIELDS.itemsize), one, one.dtype
    rec = SECTION[name].record
    off, size = rf.offsets[name]
    n = size // rec.itemsize
    raw = rf.raw[off:off + size].reshape(n, rec.itemsize)
    return raw, rec.view(rf.raw, n, off), rec.dtype


def _digest_prefixes(raw, dtype):
    """A version-2 file keeps the checkpoint digest's first bytes only: compare those."""
    kind, start = dtype.fields["checkpoint_sha256"][:2]
    out = raw.copy()
    out[:, start + R.DIGEST_PREFIX_BYTES:start + kind.itemsize] = 0
    return out


def _entry_where(name: str, k: int, field: str) -> str:
    """Name record k's field the way its section counts records."""
    if name == "timestamps":
        return f"entry {k:,} (sequence {k + 1:,}), field {field}"
    if name == "semaphores":
        return f"submission {L.SUBMISSIONS[k]}, field {field}"
    return f"field {field}"
