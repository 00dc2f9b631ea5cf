"""Two result files compared: which fields count, the tolerances, and `compare`'s report.

`compare(a, b)` walks the sections in file order (`coppelius.forensics.sections` compares each one) and
says whether the files are bit-identical, within tolerance or different, where they first differ,
and which time, environment and identity fields differ apart.  `coppelius.forensics.fleet` groups many files by
it; the command line (`coppelius diff`) prints its report.
"""
from __future__ import annotations

import numpy as np

from coppelius.staging import records as R
from coppelius.staging.result_sections import SECTIONS

from coppelius.errors import BackendUnavailable
from coppelius.forensics.sections import compare_floats, compare_predictions, compare_records
from coppelius.forensics.tolerances import RESULTS_ACROSS
from coppelius.results.reader import plain

# Fields that differ between two runs of the same bits: never make files "different"; listed apart.
TIME_FIELDS = {
    "stat": ("st_atime_ns", "st_mtime_ns", "st_ctime_ns"),
    "semaphores": ("final_timestamp", "prelaunch_timestamp"),
    "error_notifier": ("time_ns",),
    "status": ("wall_ns",),
    "timestamps": ("host_issue_ns", "device_prelaunch_ns", "device_final_ns", "host_fence_ns",
                   "host_wall_issue_ns"),
}
# Where the checkpoint input lives, which driver, GPU and host ran, and the status block's version
# (FORMATS §4): the machine and the file format, not the computation.
ENVIRONMENT_FIELDS = {
    "stat": ("st_dev", "st_ino", "st_mode", "st_uid", "st_gid", "st_blocks", "st_blksize"),
    "status": ("driver_version", "version") + R.IDENTITY_FIELDS,
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
# Record fields that hold numbers of the computation: compared by `compare_predictions`, under the
# tolerances, not bit by bit with their record.
NUMERIC_FIELDS = {"status": ("predictions",)}

# --across-backends defaults (why these: coppelius.forensics.tolerances)
ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL = RESULTS_ACROSS

IDENTITY_KEYS = ("backend", "device_name", "compute_capability", "driver_version", "ptx_target",
                 "checkpoint_sha256", "payload_sha256", "host_name", "gpu_uuid", "pci_bus_id")


# ------------------------------------------------------------------------------------ identity
def identity(rf) -> dict:
    """What names the backend and the device of one result file, as plain values."""
    st = rf.status
    code, cc = int(st["backend"]), int(st["compute_capability"])
    return {"backend": R.BACKENDS.get(code, f"code {code}"), "backend_code": code,
            "device_name": plain(st["device_name"]), "compute_capability": cc,
            "driver_version": int(st["driver_version"]), "ptx_target": ptx_target(code, cc),
            "checkpoint_sha256": rf.checkpoint_digest(),
            "payload_sha256": plain(rf.stat["payload_sha256"]), **rf.gpu_identity()}


def ptx_target(backend_code: int, compute_capability: int) -> str | None:
    """The PTX target the cuda backend loads for this compute capability; None for the interpreter.

    The result file does not record it (the status block has no field for it); the choice is a pure
    function of the compute capability, `coppelius.backends.cuda.backend.choose_target`, so it is derived here.
    """
    if backend_code != R.BACKEND_CUDA:
        return None
    # deferred: only a cuda result file needs the cuda backend, and every `coppelius` start
    # imports this module (through the diff command)
    from coppelius.backends.cuda.backend import choose_target
    try:
        return choose_target(compute_capability)
    except BackendUnavailable:
        return None


def describe(rf) -> dict:
    """What a report says of each file: path, profile, outcome, c0, sizes."""
    return {"path": rf.path, "profile": rf.profile.name, "outcome": rf.outcome,
            "c0": int(rf.status["c0"]), "steps": rf.steps, "issues": rf.issues, "size": rf.size}


# ---------------------------------------------------------------------------------- comparison
def compare(a, b, atol: float = 0.0, rtol: float = 0.0, across_backends: bool = False,
            stop_early: bool = False) -> dict:
    """Section-by-section comparison of two ResultFiles, in file order.

    `stop_early`: return at the first difference beyond tolerance, verdict "different", with the
    sections and counts found so far (a fleet's membership test); a "same" verdict is always full.
    """
    ia, ib = identity(a), identity(b)
    rep = {"a": describe(a), "b": describe(b), "atol": atol, "rtol": rtol,
           "across_backends": across_backends,
           "identity": [{"field": k, "a": ia[k], "b": ib[k], "differs": ia[k] != ib[k]}
                        for k in IDENTITY_KEYS],
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
    if _compare_sections(a, b, rep, stop_early):
        return rep
    rep.update(_verdict(rep))
    rep["timing"] = {"A_device_step_ms_p50": _p50_ms(a), "B_device_step_ms_p50": _p50_ms(b)}
    return rep


def _compare_sections(a, b, rep: dict, stop_early: bool) -> bool:
    """Every section into rep["sections"], in file order, and rep["first"]: the first difference
    beyond tolerance, else the first within it.  True when `stop_early` stopped the walk."""
    first = first_bad = None
    for section in SECTIONS:
        for s in _section_entries(section, a, b, rep, stop_early):
            rep["sections"].append(s)
            if s["first"] is None:
                continue
            if first is None:
                first = dict(s["first"], section=s["section"])
            if first_bad is None and not s["first"].get("within_tolerance", False):
                first_bad = dict(s["first"], section=s["section"])
        if stop_early and (first_bad or rep["structure"]):
            rep.update(first=first_bad or first, verdict="different", same=False,
                       stopped=section.name)
            return True
    rep["first"] = first_bad or first
    return False


def _section_entries(section, a, b, rep: dict, stop_early: bool) -> list[dict]:
    """One section's entries: fp32 words, or a record's fields (and its numeric fields apart);
    the record fields listed apart go into rep's lists."""
    name, atol, rtol = section.name, rep["atol"], rep["rtol"]
    if section.record is None:                  # fp32 words
        found = compare_floats(name, a.section(name), b.section(name), atol, rtol, a, stop_early)
        if name == "steps" and found["first"] is None and a.steps != b.steps:
            k = min(a.steps, b.steps)       # the common steps agree: the first extra one
            found["first"] = {"step": k, "row": 0, "where": f"step {k:,}: only "
                              f"{'A' if a.steps > b.steps else 'B'} has it"}
        return [found]
    apart = {"time_fields": TIME_FIELDS.get(name, ()),
             "environment_fields": ENVIRONMENT_FIELDS.get(name, ()),
             "identity_fields": IDENTITY_FIELDS.get(name, ()) if rep["across_backends"] else ()}
    entry, listed = compare_records(name, a, b, apart, skip=NUMERIC_FIELDS.get(name, ()))
    for kind, labels in listed.items():
        rep[kind] += labels
    if name in NUMERIC_FIELDS:
        return [entry, compare_predictions(a, b, atol, rtol)]
    return [entry]


def _verdict(rep: dict) -> dict:
    """A full comparison's verdict and whether the files count as the same."""
    differing = rep["structure"] or any(s["beyond_tolerance"] for s in rep["sections"])
    if differing:
        verdict = "different"
    elif any(s["differing"] for s in rep["sections"]):
        verdict = "within tolerance"
    elif rep["identity_fields"]:
        verdict = "identical except time-dependent, environment and identity fields"
    else:
        verdict = "identical except time-dependent and environment fields"
    return {"verdict": verdict, "same": not differing}


def _bit_identical(a, b) -> bool:
    """The whole files equal; the 160-byte status block first (its wall time differs between any
    two runs), so that a fleet's comparisons do not pay a full extra pass for the fast path."""
    if a.size != b.size:
        return False
    off, size = a.offsets["status"]
    if not np.array_equal(a.raw[off:off + size], b.raw[off:off + size]):
        return False
    return bool(np.array_equal(a.raw, b.raw))


def _p50_ms(rf):
    d = rf.device_step_ns()
    return float(np.median(d)) / 1e6 if d.size else None
