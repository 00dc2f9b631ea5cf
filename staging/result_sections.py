"""The result file (CONTRACT §9) as one table: every section's name, element type and size.

The writer and the reader (host/results/writer.py, host/results/reader.py), the size formula
below, `coppelius inspect` and `coppelius diff` all walk `SECTIONS`; nothing else spells the
file's order or a section's size.

A section is `repeat` units of one element array: the unit's shape is a function of the profile
(fp32 logits are (3, V) or (V,)), its element type fp32 or a record of `coppelius.staging.records`; a
section repeats once per completed step (`steps`), once per issue (`timestamps`), or not at all.

    forward (3·V·4) | steps (4096 × steps) | stat (160) | loss_block (16384) | final (V·4) |
    semaphores (32 × 3) | error_notifier (64) | status (160) | timestamps (64 × issues)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from coppelius.staging import layout as L
from coppelius.staging import records as R

F32 = np.dtype("<f4")
ONCE, PER_STEP, PER_ISSUE = "once", "step", "issue"


@dataclass(frozen=True)
class Section:
    """One section: `repeat` × a unit of `unit_shape(profile)` elements of `record` (or fp32)."""
    name: str                                   # key of offsets, inspect's and diff's output
    label: str                                  # what refusals and inspect call it
    unit_shape: Callable[[object], tuple]       # profile → shape of one unit; () = one record
    record: R.Record | None = None              # None: fp32 words
    repeat: str = ONCE                          # ONCE, PER_STEP or PER_ISSUE

    @property
    def dtype(self) -> np.dtype:
        return F32 if self.record is None else self.record.dtype

    def unit_bytes(self, profile) -> int:
        return math.prod(self.unit_shape(profile)) * self.dtype.itemsize

    def count(self, steps: int, issues: int) -> int:
        return {ONCE: 1, PER_STEP: steps, PER_ISSUE: issues}[self.repeat]

    def nbytes(self, profile, steps: int, issues: int) -> int:
        return self.unit_bytes(profile) * self.count(steps, issues)

    def shape(self, profile, steps: int, issues: int) -> tuple:
        unit = tuple(self.unit_shape(profile))
        return unit if self.repeat == ONCE else (self.count(steps, issues),) + unit

    def view(self, raw: np.ndarray, offset: int, profile, steps: int, issues: int):
        """Typed zero-copy view of this section in `raw` (u8): an array, or one record (np.void)."""
        data = raw[offset:offset + self.nbytes(profile, steps, issues)]
        arr = data.view(self.dtype).reshape(self.shape(profile, steps, issues))
        return arr[()] if arr.shape == () else arr


SECTIONS = (
    Section("forward", "forward part", lambda p: (L.RECORD_FORWARD_ROWS, p.vocab)),
    Section("steps", "step windows", lambda p: (L.STEP_WINDOW_BYTES // F32.itemsize,),
            repeat=PER_STEP),
    Section("stat", "stat record", lambda p: (), R.STAT_RECORD),
    Section("loss_block", "loss block", lambda p: (L.LOSS_WINDOWS, L.LOSS_WINDOW_WORDS)),
    Section("final", "final part", lambda p: (p.vocab,)),
    Section("semaphores", "semaphore region", lambda p: (len(L.SUBMISSIONS),), R.SEMAPHORE_SLOT),
    Section("error_notifier", "error notifier", lambda p: (), R.ERROR_NOTIFIER),
    Section("status", "status block", lambda p: (), R.STATUS_BLOCK),
    Section("timestamps", "timestamp table", lambda p: (), R.TIMESTAMP_ENTRY, PER_ISSUE),
)
SECTION = {s.name: s for s in SECTIONS}
NAMES = tuple(SECTION)
TAIL = SECTIONS[NAMES.index("steps") + 1:]      # what the run writes once, after the last step


def section_offsets(profile, steps: int, issues: int) -> dict[str, tuple[int, int]]:
    """name → (offset, size) for every section, in file order."""
    out, at = {}, 0
    for s in SECTIONS:
        out[s.name] = (at, s.nbytes(profile, steps, issues))
        at += out[s.name][1]
    return out


def result_file_bytes(profile, steps_completed: int, issues: int) -> int:
    """Exact size of a result file; a completed run has issues = steps + 2 (forward, final)."""
    return sum(s.nbytes(profile, steps_completed, issues) for s in SECTIONS)
