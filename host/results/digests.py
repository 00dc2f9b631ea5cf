"""Per-launch digests of one update step: the summary of a region's bytes, and the digests file
(JSON, versioned: docs/FORMATS.md §11) with its writer and its reader.

A region's summary is its sha256 (bitwise comparisons) and a numeric fingerprint that tolerances
apply to (comparisons across backends): sum, sum of |x|, sum of squares and max |x| over the
finite elements (float64), the NaN and Inf counts, and for a launch's writes a fixed strided
sample of SAMPLE elements with their indices.  A read is summarized without a sample and names,
when its bytes are exactly what an earlier write record of the same file produced, that record
(`source`): the bisect then judges the read by that write.  The reader refuses, naming the field
and with a hint, a file that is not JSON (truncated), of another format or version, with a field
missing or of the wrong kind, or whose content digest differs (altered).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from coppelius.staging import paths

from coppelius.staging.errors import UserError

FORMAT = "coppelius-digests"
VERSION = 1
SAMPLE = 200                    # sampled elements of a write region (all of a smaller one)
NUMPY = {"fp32": "<f4", "bf16": "<u2", "i32": "<i4", "u32": "<u4"}
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}   # JSON has no NaN: strings
REGION_KEYS = ("name", "space", "offset", "run", "repeat", "stride", "dtype", "count", "sha256",
               "sum", "abs_sum", "sum_sq", "max_abs", "nan", "inf")
LAUNCH_KEYS = ("index", "label", "function", "kernel", "code", "lane", "reads", "writes")
HEADER_KEYS = ("format", "version", "profile", "submission", "plan", "launch_count", "step", "c0",
               "context", "sequence", "t_base", "backend", "device", "target", "made",
               "replay_matches_issue", "replay_differs", "sample", "content_sha256")
HINT = "make it again with `coppelius run … --digests FILE`"


class DigestsError(UserError):
    """A digests file that cannot be read or compared."""


def sample_indices(count: int, size: int = SAMPLE) -> np.ndarray:
    """The fixed strided sample: element k·(count − 1) // (size − 1) for k < size, the first and
    the last included (every element when count ≤ size)."""
    if count <= size:
        return np.arange(count, dtype=np.int64)
    k = np.arange(size, dtype=np.int64)
    return k * (count - 1) // (size - 1)


def values(dtype: str, raw: np.ndarray) -> np.ndarray:
    """A region's bytes as numbers: fp32 and bf16 as float32, integers as int64."""
    v = np.ascontiguousarray(raw).view(NUMPY[dtype])
    if dtype == "bf16":
        return (v.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return v.astype(np.int64) if dtype in ("i32", "u32") else v


def _number(x) -> float | int | str:
    """One sampled value as JSON holds it: fp32 in 9 significant digits (it reads back exact),
    integers as they are, NaN and infinities as strings."""
    if isinstance(x, (np.integer, int)):
        return int(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.9g}")


def number(x) -> float:
    """A sampled value read back (the inverse of `_number`)."""
    return NONFINITE[x] if isinstance(x, str) else float(x)


def summary(region, raw: np.ndarray, sample: bool = True) -> dict:
    """The record of one region (plan/launches/regions.Region) from its bytes (its runs, in order)."""
    v = values(region.dtype, raw)
    f = v.astype(np.float64)
    finite = np.isfinite(f)
    ok = f[finite]
    rec = {"name": region.name, "space": region.space, "offset": region.offset,
           "run": region.run, "repeat": region.repeat, "stride": region.stride,
           "dtype": region.dtype, "count": int(v.size),
           "sha256": hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest(),
           "sum": float(ok.sum()), "abs_sum": float(np.abs(ok).sum()),
           "sum_sq": float((ok * ok).sum()), "max_abs": float(np.abs(ok).max(initial=0.0)),
           "nan": int(np.isnan(f).sum()), "inf": int(np.isinf(f).sum())}
    if region.partial:
        rec["partial"] = True
    if region.volatile:
        rec["volatile"] = True
    if sample:
        idx = sample_indices(v.size)
        rec["sample_index"] = idx.tolist()
        rec["sample"] = [_number(x) for x in v[idx]]
    return rec


def content_sha256(doc: dict) -> str:
    """The digest of everything but itself (canonical JSON: sorted keys, no spaces)."""
    body = {k: v for k, v in doc.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     allow_nan=False).encode()).hexdigest()


def write(path: Path, doc: dict) -> None:
    """The file, one launch a line, written beside the path and renamed over it (whole or not
    at all)."""
    doc = dict(doc, format=FORMAT, version=VERSION)
    doc["content_sha256"] = content_sha256(doc)
    head = {k: v for k, v in doc.items() if k != "launches"}
    lines = [json.dumps(x, separators=(",", ":"), allow_nan=False) for x in doc["launches"]]
    text = (json.dumps(head, indent=1, allow_nan=False)[:-2] + ',\n "launches": [\n'
            + ",\n".join(lines) + "\n ]\n}\n")
    with paths.atomic_write(path, "digests file") as f:
        f.write(text.encode())


# ------------------------------------------------------------------------------------ reading
def _refuse(path, what: str, hint: str = HINT):
    raise DigestsError(f"{path}: {what}", hint)


def _kind(path, where: str, value, kind, key: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        _refuse(path, f"{where}: field {key!r} is {type(value).__name__}, not "
                f"{getattr(kind, '__name__', 'a number')}")


def _fields(path, where: str, obj, keys) -> None:
    if not isinstance(obj, dict):
        _refuse(path, f"{where} is not an object")
    missing = [k for k in keys if k not in obj]
    if missing:
        _refuse(path, f"{where} has no field {missing[0]!r}")


def _check_region(path, where: str, r, sampled: bool) -> None:
    _fields(path, where, r, REGION_KEYS + (("sample_index", "sample") if sampled else ()))
    for k in ("offset", "run", "repeat", "stride", "count", "nan", "inf"):
        _kind(path, where, r[k], int, k)
    for k in ("sum", "abs_sum", "sum_sq", "max_abs"):
        _kind(path, where, r[k], (int, float), k)
    if r["count"] != r["run"] * r["repeat"]:
        _refuse(path, f"{where}: count {r['count']} is not run × repeat")
    if sampled and (len(r["sample"]) != len(r["sample_index"])
                    or r["sample_index"] != sample_indices(r["count"]).tolist()):
        _refuse(path, f"{where}: the sample is not the fixed strided sample of {r['count']} "
                "elements")


def _check_launch(path, i: int, x) -> None:
    where = f"launch {i}"
    _fields(path, where, x, LAUNCH_KEYS)
    if x["index"] != i:
        _refuse(path, f"{where}: field 'index' is {x['index']!r}")
    for kind, sampled in (("reads", False), ("writes", True)):
        if not isinstance(x[kind], list):
            _refuse(path, f"{where}: field {kind!r} is not a list")
        for j, r in enumerate(x[kind]):
            _check_region(path, f"{where} ({x.get('label')}) {kind}[{j}]", r, sampled)


def read(path) -> dict:
    """A digests file, checked whole (see the module docstring for what is refused)."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        _refuse(path, "not a digests file (not UTF-8 text)")
    try:
        doc = json.loads(text, parse_constant=lambda c: _refuse(path, f"holds {c}, not JSON"))
    except ValueError as e:
        _refuse(path, f"not a complete JSON document ({e}): truncated or not a digests file")
    _fields(path, "the file", doc, ("format", "version"))
    if doc["format"] != FORMAT:
        _refuse(path, f"format is {doc['format']!r}, not {FORMAT!r}")
    if doc["version"] != VERSION:
        _refuse(path, f"digests version {doc['version']!r}; this coppelius reads version "
                f"{VERSION}", "make it again with this coppelius")
    _fields(path, "the header", doc, HEADER_KEYS + ("launches",))
    if doc["content_sha256"] != content_sha256(doc):
        _refuse(path, "content digest differs: the file was altered after it was written")
    if not isinstance(doc["launches"], list) or len(doc["launches"]) != doc["launch_count"]:
        _refuse(path, f"holds {len(doc['launches'])} launches, its header says "
                f"{doc['launch_count']}")
    for i, x in enumerate(doc["launches"]):
        _check_launch(path, i, x)
    return doc
