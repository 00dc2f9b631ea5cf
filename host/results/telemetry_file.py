"""The telemetry file beside a result file (docs/FORMATS.md §12): what NVML said about the run's
GPU when the run started, at each checkpoint publication and at its end.

The result file's bytes are the same on every GPU (runs are compared bit for bit), so the GPU's
temperature, power, clocks, throttle reasons and error counters go beside it, in
`<result file name>.telemetry.json` (UTF-8 JSON, versioned).  `Recorder` writes it during a run
on the cuda backend, whole each time it grows (a temporary renamed over it, so a reader never
sees half of it); `read` checks one and refuses, naming the file and the field, anything else;
`for_result` is what `coppelius inspect` shows of the one beside a result file.

Telemetry never fails a run: without nvidia-ml-py or the NVML library the file records why
("telemetry unavailable: …"), and a file that cannot be written is a warning on the terminal.
The interpret backend runs on no GPU and writes none."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from coppelius.staging import paths

from coppelius.staging.errors import UserError
from coppelius.telemetry import READINGS, Telemetry, summary_line

FORMAT = "coppelius-telemetry"
VERSION = 1
SUFFIX = ".telemetry.json"                  # appended to the result file's name
PHASES = ("start", "publication", "end")
WALL_TIME_SPEC = "milliseconds"             # datetime.isoformat's precision for `wall_time`
TOP_KEYS = ("format", "version", "result", "host", "c0", "gpu", "available", "reason", "samples")
GPU_KEYS = ("index", "uuid", "pci_bus_id", "name")
SAMPLE_KEYS = ("phase", "update_count", "t_s", "wall_time", "readings")
FRACTIONAL = ("power_w",)                   # NVML's milliwatts in watts; every other reading counts
REMAKE_HINT = "it is advisory: delete it, or run again to record a new one"


class TelemetryFileError(UserError):
    """A telemetry file that is not one this coppelius reads; the message names the file and the
    field."""


def path_for(result) -> Path:
    """The telemetry file of a result file: beside it, its name plus SUFFIX."""
    result = Path(result)
    return result.with_name(result.name + SUFFIX)


class Recorder:
    """The telemetry of one run's GPU, sampled at the run's start, at each completed publication
    (on the publisher's thread: off the step loop) and at its end, written beside the result file
    after each sample.  `gpu`: the backend's coppelius.driver.device.GpuIdentity, None on the
    interpreter (no GPU: nothing is sampled or written).  `warn`: one line on the terminal.
    Never raises: a failure to sample reads as nulls, a failure to write is one warning."""

    def __init__(self, result, gpu, c0: int, warn):
        self.path, self.warn = path_for(result), warn
        self.lock = threading.Lock()        # the publisher's thread samples too
        self.written = False                # this run wrote the file (so `discard` removes it)
        self.warned = False
        self.t0: float | None = None
        self.telemetry = self.doc = None
        if gpu is None:
            return
        self.uuid = gpu.uuid_text
        self.telemetry = Telemetry([self.uuid])
        self.doc = {"format": FORMAT, "version": VERSION, "result": Path(result).name,
                    "host": socket.gethostname(), "c0": c0,
                    "gpu": {"index": gpu.ordinal, "uuid": self.uuid,
                            "pci_bus_id": gpu.pci_bus_id, "name": gpu.name},
                    "available": self.telemetry.available, "reason": self.telemetry.reason,
                    "samples": []}

    def sample(self, phase: str, update_count: int) -> None:
        """One sample (phase: one of PHASES), then the file rewritten.  Unavailable telemetry is
        written once, with its reason."""
        if self.doc is None:
            return
        with self.lock:
            if self.telemetry.available:
                now = time.monotonic()
                self.t0 = now if self.t0 is None else self.t0
                try:
                    readings = self.telemetry.read().get(self.uuid)
                except Exception:           # NVML gone mid-run: this sample reads as nulls
                    readings = None
                self.doc["samples"].append({
                    "phase": phase, "update_count": int(update_count),
                    "t_s": round(now - self.t0, 3),
                    "wall_time": datetime.now(timezone.utc).isoformat(timespec=WALL_TIME_SPEC),
                    "readings": readings or dict.fromkeys(READINGS)})
            elif self.written:
                return
            self._write()

    def _write(self) -> None:
        text = json.dumps(self.doc, indent=1, allow_nan=False) + "\n"
        try:
            with paths.atomic_write(self.path, "telemetry file") as f:
                f.write(text.encode())
        except (OSError, UserError) as e:
            if not self.warned:
                self.warned = True
                self.warn(f"warning: cannot write the telemetry file {self.path}: {e} (the run "
                          "goes on and its result file is unaffected; check the directory's "
                          "space and permissions)")
            return
        self.written = True

    def discard(self) -> None:
        """The run wrote no result (refused or interrupted before its first step): its telemetry
        file goes too."""
        with self.lock:
            if self.written:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                self.written = False

    def close(self) -> None:
        """NVML let go, after a sample in flight on the publisher's thread."""
        if self.telemetry is not None:
            with self.lock:
                self.telemetry.close()


# ------------------------------------------------------------------------------------ reading
def _refuse(path, what: str):
    raise TelemetryFileError(f"telemetry file {path}: {what}", REMAKE_HINT)


def _is(value, kind) -> bool:
    if isinstance(value, bool):             # JSON true is no count
        return kind is bool
    return isinstance(value, kind)


def _field(path, where: str, obj: dict, key: str, kind, what: str, nullable=False):
    if key not in obj:
        _refuse(path, f"{where}has no field {key!r}")
    value = obj[key]
    if not (_is(value, kind) or (nullable and value is None)):
        _refuse(path, f"{where}field {key!r} is {json.dumps(value)[:40]}, not {what}")
    return value


def _object(path, where: str, value, keys) -> dict:
    if not isinstance(value, dict):
        _refuse(path, f"{where or 'the file '}is not a JSON object")
    for k in keys:
        if k not in value:
            _refuse(path, f"{where}has no field {k!r}")
    return value


def _check_sample(path, i: int, s) -> None:
    where = f"samples[{i}]: "
    _object(path, where, s, SAMPLE_KEYS)
    if s["phase"] not in PHASES:
        _refuse(path, f"{where}field 'phase' is {json.dumps(s['phase'])[:40]}, not one of "
                f"{', '.join(PHASES)}")
    count = _field(path, where, s, "update_count", int, "a count")
    t = _field(path, where, s, "t_s", (int, float), "seconds")
    for key, value in (("update_count", count), ("t_s", t)):
        if value < 0:
            _refuse(path, f"{where}field {key!r} is {value}, below 0")
    _field(path, where, s, "wall_time", str, "a time")
    where = f"samples[{i}].readings: "
    r = _object(path, where, s["readings"], READINGS)
    for k in READINGS:
        if k in FRACTIONAL:
            _field(path, where, r, k, (int, float), "a number or null", nullable=True)
        else:
            _field(path, where, r, k, int, "a whole number or null", nullable=True)


def read(path) -> dict:
    """A telemetry file, checked whole: TelemetryFileError names the field that is wrong."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        _refuse(path, "not UTF-8 text")
    except OSError as e:
        _refuse(path, f"cannot be read ({paths.errno_text(e)})")
    try:
        doc = json.loads(text, parse_constant=lambda c: _refuse(path, f"holds {c}, not JSON"))
    except ValueError as e:
        _refuse(path, f"not a complete JSON document ({e})")
    _object(path, "", doc, ("format", "version"))
    if doc["format"] != FORMAT:
        _refuse(path, f"field 'format' is {json.dumps(doc['format'])[:40]}, not {FORMAT!r}")
    if doc["version"] != VERSION:
        _refuse(path, f"field 'version' is {json.dumps(doc['version'])[:40]}; this coppelius "
                f"reads version {VERSION}")
    _object(path, "", doc, TOP_KEYS)
    for key, kind, what in (("result", str, "a file name"), ("host", str, "a host name"),
                            ("c0", int, "an update count"), ("available", bool, "true or false")):
        _field(path, "", doc, key, kind, what)
    _field(path, "", doc, "reason", str, "a reason or null", nullable=True)
    gpu = _object(path, "gpu: ", doc["gpu"], GPU_KEYS)
    _field(path, "gpu: ", gpu, "index", int, "an ordinal")
    for key in ("uuid", "pci_bus_id", "name"):
        _field(path, "gpu: ", gpu, key, str, "a string")
    samples = _field(path, "", doc, "samples", list, "a list")
    for i, s in enumerate(samples):
        _check_sample(path, i, s)
    return doc


def for_result(result, ran_on: dict, c0: int) -> dict | None:
    """What `coppelius inspect` shows of the telemetry file beside `result`: None when there is
    none; else the file's fields with `file`, `summary` (coppelius.telemetry.summary_line) and
    `error` (null, or why it is not shown: unreadable, or another run's).  `ran_on`: the result
    file's gpu_identity(); `c0`: its status block's."""
    path = path_for(result)
    if not path.exists():
        return None
    try:
        doc = read(path)
    except TelemetryFileError as e:
        return {"file": str(path), "error": e.message}
    if (doc["gpu"]["uuid"], doc["c0"]) != (ran_on.get("gpu_uuid"), c0):
        return {"file": str(path), "error": (
            f"telemetry file {path}: field 'gpu' names {doc['gpu']['uuid'] or 'no GPU'} and "
            f"'c0' {doc['c0']}, the result file {ran_on.get('gpu_uuid') or 'no GPU'} and c0 "
            f"{c0}: it belongs to another run (not shown)")}
    readings = [s["readings"] for s in doc["samples"]]
    return dict(doc, file=str(path), error=None,
                summary=summary_line(readings) if doc["available"] else None)
