"""Metrics rows (coppelius.node.metrics.Gpu) from result files that runs left elsewhere: the
fleet's job array (`<node>.bin` per Slurm node in the results directory) and the Slurm node check
(each GPU's result on its node), for `coppelius metrics`.

The verdicts are `coppelius node`'s (`judge_files`: against the known-good files, else the
majority, a tie never guessed); what a run measured comes from its result file (its identity,
the run's own wall time, the wall-clock time of its last issue, the median host gap) and from
the telemetry file beside it where that belongs to the same run (its NVML samples).  These
runs' processes were never watched from here, so a missing or unreadable file is a FAIL and
none is an ERROR; a digest's first kernel and a soak are `coppelius node`'s alone."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coppelius.staging import records as R

from coppelius.node.metrics import US_PER_S, Gpu
from coppelius.node.report import host_gap_median_us
from coppelius.node.verdicts import judge_files
from coppelius.results import telemetry_file
from coppelius.results.reader import ResultFileError, plain, read

NS_PER_S = 1e9                  # the result file's times are nanoseconds


@dataclass(frozen=True)
class Gathered:
    """One result file and the labels it goes under: its host, and its CUDA ordinal where the
    caller knows it ("" otherwise)."""
    host: str
    index: str
    path: Path


def rows(results: list[Gathered], expect=None) -> list[Gpu]:
    """One row per result file, in order."""
    verdicts = judge_files([r.path for r in results], expect)
    return [_row(r, v) for r, v in zip(results, verdicts)]


def _row(r: Gathered, verdict: dict) -> Gpu:
    common = dict(host=r.host, index=r.index, verdict=verdict["verdict"],
                  first_difference=verdict["first_difference"])
    try:
        rf = read(r.path)
    except ResultFileError:
        return Gpu(uuid="", pci_bus_id="", model="", profile="", backend="", steps=None,
                   **common)
    status = rf.status
    ident = rf.gpu_identity()
    wall = rf.timestamps["host_wall_issue_ns"]
    gap_us = host_gap_median_us(r.path)
    return Gpu(uuid=ident["gpu_uuid"], pci_bus_id=ident["pci_bus_id"],
               model=plain(status["device_name"]), profile=rf.profile.name,
               backend=R.BACKENDS.get(int(status["backend"]), "unknown"),
               steps=int(status["steps_planned"]),
               ended_unix_s=float(wall.max()) / NS_PER_S if wall.size else None,
               wall_s=int(status["wall_ns"]) / NS_PER_S,
               host_gap_median_s=None if gap_us is None else gap_us / US_PER_S,
               readings=_readings(rf, ident), **common)


def _readings(rf, ident: dict) -> tuple:
    """The NVML samples of the telemetry file beside the result, where it is this run's."""
    doc = telemetry_file.for_result(rf.path, ident, int(rf.status["c0"]))
    if doc is None or doc["error"] or not doc["available"]:
        return ()
    return tuple(s["readings"] for s in doc["samples"])
