"""The Python API of the forensics (re-exported by `coppelius.forensics`; docs/API.md).

Each function does what one `coppelius` command does, with the same rules, and returns data
instead of printing it: `read_result` (every section of a result file), `read_checkpoint` /
`verify_checkpoint` (`coppelius checkpoint verify`), `compare_results` / `classify_results`
(`coppelius diff`), `compare_digests` (`coppelius bisect`), `summarize_run` (`coppelius inspect`),
`verify_result` (`coppelius verify`).  Refusals are the command line's: UserError subclasses with a
message and a hint (`str(e)` is both), never a traceback's worth of internals.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from coppelius.staging.errors import UserError

from coppelius.forensics.checkpoint import Checkpoint, read_checkpoint, verify_checkpoint
from coppelius.forensics.tolerances import DIGESTS_ACROSS, RESULTS_ACROSS, resolve
from coppelius.forensics.verify import verify as verify_result

__all__ = ["Result", "read_result", "Checkpoint", "read_checkpoint", "verify_checkpoint",
           "compare_results", "classify_results", "compare_digests", "summarize_run",
           "verify_result", "json_ready", "dumps"]


@dataclass(frozen=True)
class Result:
    """One result file, every section decoded.

    `sections`: each section (file order) by its name — forward, steps, stat, loss_block, final,
    semaphores, error_notifier, status, timestamps — as a read-only numpy array over the file's
    memory map: fp32 sections as float32 arrays (steps: (steps, 1024), the per-row losses), record
    sections as structured arrays (0-d for one record).  `records`: the record sections as plain
    Python values (a dict, or a list of dicts for semaphores and timestamps).  `file`: the
    underlying `coppelius.results.reader.ResultFile` (step_losses(), device_step_ns(), …)."""
    path: str
    profile: str
    outcome: str
    steps: int
    sections: dict = field(repr=False)
    records: dict = field(repr=False)
    file: object = field(repr=False)

    def step_losses(self) -> np.ndarray:
        """Mean cross-entropy per completed step, (steps,) float64."""
        return self.file.step_losses()


def read_result(path) -> Result:
    """Read the result file at `path` (any profile, any outcome).

    Raises ResultFileError (a UserError) naming why a file is not a readable result file."""
    from coppelius.results.reader import read, record_dict
    from coppelius.staging.result_sections import SECTIONS
    rf = read(path)
    sections, records = {}, {}
    for s in SECTIONS:
        view = np.asarray(rf.section(s.name))
        sections[s.name] = view
        if s.record is not None:
            records[s.name] = (record_dict(view[()]) if view.ndim == 0 else
                               [record_dict(r) for r in view])
    return Result(path=rf.path, profile=rf.profile.name, outcome=rf.outcome, steps=rf.steps,
                  sections=sections, records=records, file=rf)


def compare_results(a, b, atol: float | None = None, rtol: float | None = None,
                    across_backends: bool = False) -> dict:
    """Compare result files `a` and `b` with `coppelius diff A B`'s rules; the report its --json
    prints: "same", "verdict", "first" (section, place), "sections", the time, environment and
    identity fields listed apart, "identity", "classes".

    `atol`/`rtol`: the tolerances (default 0, bits must match; with `across_backends` the
    defaults of coppelius.forensics.tolerances.RESULTS_ACROSS).  UserError for a bad tolerance or
    an unreadable file."""
    from coppelius.forensics.fleet import classify
    atol, rtol = resolve(atol, rtol, across_backends, RESULTS_ACROSS)
    fleet = classify([a, b], atol, rtol, across_backends)
    return dict(fleet["reports"][1], classes=fleet["classes"])


def classify_results(paths, atol: float | None = None, rtol: float | None = None,
                     across_backends: bool = False) -> dict:
    """Group result files into classes of identical results with `coppelius diff A B C …`'s rules
    (each file tested against each class's first member, in the order given); the report its
    --json prints: "same" (one class), "verdict", "classes" (members, first difference)."""
    from coppelius.forensics.fleet import classify
    paths = list(paths)
    if not paths:
        raise UserError("no result files to classify", "pass one or more result files")
    atol, rtol = resolve(atol, rtol, across_backends, RESULTS_ACROSS)
    fleet = classify(paths, atol, rtol, across_backends)
    del fleet["reports"]
    return fleet


def compare_digests(a, b, atol: float | None = None, rtol: float | None = None,
                    across_backends: bool = False) -> dict:
    """Compare two digests files (`coppelius run … --digests FILE`) with `coppelius bisect A B`'s
    rules; the report its --json prints: "same", "first" (the first differing launch, its verdict
    "diverged" or "inherited", its regions), "later".

    Bitwise by default; `atol` is relative to each region's largest |x| (defaults with
    `across_backends`: coppelius.forensics.tolerances.DIGESTS_ACROSS).  DigestsError (a UserError)
    for an unreadable file or two files of different computations."""
    from coppelius.forensics.bisect import Rules, bisect
    from coppelius.results import digests
    rules = Rules(*resolve(atol, rtol, across_backends, DIGESTS_ACROSS))
    return bisect(digests.read(a), digests.read(b), rules, os.fspath(a), os.fspath(b))


def summarize_run(path, stream: str = "auto") -> dict:
    """What `coppelius inspect RESULT --json` prints, as a dict: identity, sizes, sections, losses
    and their summary, the embedded stream's floor, timing, records, predictions, warnings.

    `stream`: "auto", "embedded" or "none" — whether the run trained on the embedded stream
    (inspect's --stream)."""
    from coppelius.forensics.summary import STREAM_CHOICES, stream_used, summarize
    from coppelius.results.reader import read
    if stream not in STREAM_CHOICES:
        raise UserError(f"stream {stream!r} is not one of {', '.join(STREAM_CHOICES)}",
                        "pass auto, embedded or none")
    rf = read(path)
    return summarize(rf, stream_used(rf, stream))


def json_ready(x):
    """A report with its non-finite floats as None (JSON has no NaN or infinity)."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_ready(v) for v in x]
    return x


def dumps(report) -> str:
    """A report as the one JSON object the commands' --json prints."""
    return json.dumps(json_ready(report), allow_nan=False)
