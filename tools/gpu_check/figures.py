"""The device check's figures from result files: step timing, publication stalls, continuation bits.

Plain numpy over `coppelius.results.reader` (no Triton, no torch, no driver): what the device check
reports for the production and full runs, computed the same way on a GPU run and on a dry run.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from coppelius.results.reader import read
from coppelius.staging import layout as L

PUBLISHED = re.compile(r"published update (\d+) \(([\d.]+) s\)")   # `coppelius run --quiet` lines


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def _r(x, digits: int = 4):
    return None if x is None else round(float(x), digits)


def step_timing(rf) -> dict:
    """Device time per update (the releases' stamps), host gap between updates, fence to fence."""
    u = rf.update_entries()                                                 # (updates,)
    issue = u["host_issue_ns"].astype(np.int64)
    fence = u["host_fence_ns"].astype(np.int64)
    device_ms = (u["device_final_ns"].astype(np.int64)
                 - u["device_prelaunch_ns"].astype(np.int64)) / 1e6        # (updates,)
    gap_us = (issue[1:] - fence[:-1]) / 1e3                                 # (updates-1,)
    f2f_ms = np.diff(fence) / 1e6                                           # (updates-1,)
    span_s = (fence[-1] - issue[0]) / 1e9 if u.size else 0.0
    return {"updates": int(u.size),
            "device_ms_p50": _r(_pct(device_ms, 50)), "device_ms_p90": _r(_pct(device_ms, 90)),
            "device_ms_max": _r(device_ms.max() if device_ms.size else None),
            "host_gap_us_p50": _r(_pct(gap_us, 50), 1), "host_gap_us_p99": _r(_pct(gap_us, 99), 1),
            "fence_to_fence_ms_p50": _r(_pct(f2f_ms, 50)),
            "fence_to_fence_ms_p99": _r(_pct(f2f_ms, 99)),
            "steps_per_s": _r(u.size / span_s, 2) if span_s > 0 else None,
            "wall_s": _r(int(rf.status["wall_ns"]) / 1e9, 2)}


def run_figures(path: Path) -> dict:
    """Outcome, steps, publications, losses and step timing of one result file."""
    rf = read(path)
    losses = rf.step_losses()
    return {"outcome": rf.outcome, "steps": rf.steps, "c0": int(rf.status["c0"]),
            "publications": int(rf.status["publications"]),
            "loss_first": _r(losses[0] if losses.size else None, 6),
            "loss_last": _r(losses[-1] if losses.size else None, 6), **step_timing(rf)}


def publication_stalls(path: Path, log_text: str) -> dict:
    """What each publication cost the step loop: the host gap after the update that started it
    (the device snapshot and the thread's start, up to the next issue, the final one included)
    beyond the median gap between updates, and the fence-to-fence time beyond the median summed
    over the steps its stream overlapped (from the run's `published … (X s)` lines)."""
    rf = read(path)
    ts = rf.timestamps                                                      # (issues,) in order
    issue, fence = ts["host_issue_ns"].astype(np.int64), ts["host_fence_ns"].astype(np.int64)
    update = np.nonzero(ts["submission"] == L.SUBMISSION_UPDATE)[0]        # (updates,) indices
    update = update[update + 1 < ts.size]                                   # each with a next issue
    gap = (issue[update + 1] - fence[update]) / 1e6                         # ms after each update
    f2f = np.diff(fence[update]) / 1e6                                      # ms, update → update
    if not gap.size:
        return {"publications": []}
    gap_p50 = float(np.median(gap[:-1] if gap.size > 1 else gap))          # between updates
    f2f_p50 = float(np.median(f2f)) if f2f.size else 0.0
    c0 = int(rf.status["c0"])
    out = []
    for m in PUBLISHED.finditer(log_text):
        count, seconds = int(m.group(1)), float(m.group(2))
        i = count - c0 - 1                                  # the update whose fence started it
        row = {"update": count, "stream_s": seconds}
        if 0 <= i < gap.size:
            n = int(np.ceil(seconds * 1e3 / f2f_p50)) if f2f_p50 > 0 else 0
            overlapped = f2f[i:i + n]                       # the steps its stream ran beside
            row.update(gap_ms=_r(gap[i], 3), stall_ms=_r(gap[i] - gap_p50, 3),
                       overlapped_steps=int(overlapped.size),
                       slowdown_ms=_r(float(np.sum(overlapped - f2f_p50)), 3))
        out.append(row)
    stalls = [r["stall_ms"] for r in out if "stall_ms" in r]
    return {"publications": out, "host_gap_ms_p50": _r(gap_p50, 4),
            "stall_ms_max": max(stalls) if stalls else None,
            "stall_ms_p50": _r(np.median(stalls), 3) if stalls else None}


def windows_match(reference: Path, part: Path, first_step: int) -> dict:
    """Whether `part`'s loss windows are bit-identical to the reference's steps from first_step."""
    ref, got = read(reference), read(part)
    n = got.steps
    want = np.asarray(ref.losses[first_step:first_step + n])
    have = np.asarray(got.losses)
    same = want.shape == have.shape and want.tobytes() == have.tobytes()
    out = {"steps": n, "from_step": first_step, "bit_identical": bool(same)}
    if not same and want.shape == have.shape:
        bad = np.nonzero((want.view(np.uint32) != have.view(np.uint32)).any(axis=1))[0]
        out["first_differing_step"] = int(first_step + bad[0])
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()
