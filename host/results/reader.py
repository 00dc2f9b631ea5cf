"""The result file's reader (CONTRACT §8–§9): any profile and outcome, typed views of a memory map.

How the reader recovers profile, steps and issues from nothing but the file: for each profile, R =
size − (every section at s = i = 0) must be 4096·s + 64·i with s, i ≥ 0.  Since 4096 = 64·64, every
s in 0..R//4096 gives one i, and with it one position for the status block (size − 64·i − 160).  A
position is *consistent* when it holds the magic `COPPSTAT` and the block's own steps_completed and
gpPut equal s and i (gpPut counts issues; the table has one entry per issue).  The magic test runs
over all candidate positions at once (≤ 10,001 for a production run).  Exactly one consistent
(profile, s, i) is accepted; a tie is broken by steps_planned = the profile's steps.  When none is
consistent, `_diagnose` finds the last status magic in the file and says what is wrong: trailing
bytes, a truncated tail, a misplaced block, a missing tail (a run killed before writing it), or a
file that is not a result file at all (a checkpoint, say).
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from coppelius.plan import profiles as P
from coppelius.staging import layout as L
from coppelius.staging import paths
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS

from coppelius.checkpoints.format import MAGIC as CHECKPOINT_MAGIC
from coppelius.driver.device import pci_bus_id_text, uuid_text
from coppelius.staging.errors import UserError

U64_MAX = 2 ** 64 - 1
FORWARD, STEPS, STATUS, TIMESTAMPS = (RS.SECTION[n] for n in ("forward", "steps", "status",
                                                               "timestamps"))
ATTRIBUTES = {"steps": "losses"}            # section → ResultFile attribute, where they differ


class ResultFileError(UserError):
    """A file is not a readable result file; the message says precisely why, in one line."""


def _status_fields_record() -> R.Record:
    """Not a file layout: the status block as the reader gives it for either version (FORMATS
    §4): version 1's fields at their offsets (a version-2 file's update_count derived, its
    predictions split into {token, valid}, its 8-byte checkpoint digest followed by zeros), then
    version 2's identity fields (zeros in a version-1 file)."""
    v1, v2 = R.STATUS_BLOCK, R.STATUS_BLOCK_V2
    fields = [(name, v1.dtype.fields[name][0], v1.offset(name)) for name in v1.fields]
    at = v1.itemsize
    for name in R.IDENTITY_FIELDS:
        fields.append((name, v2.dtype.fields[name][0], at))
        at += v2.dtype.fields[name][0].itemsize
    return R.Record("status fields", fields, at)


STATUS_FIELDS = _status_fields_record()
VALID_SHIFT = R.PREDICTION_VALID_BIT.bit_length() - 1


def status_fields(block) -> np.void:
    """A status block of either version (its 160 bytes) as one STATUS_FIELDS record (a copy)."""
    data = np.frombuffer(memoryview(block).cast("B"), np.uint8)
    at, kind = R.STATUS_BLOCK.offset("version"), R.STATUS_BLOCK.dtype["version"]
    version = int(data[at:at + kind.itemsize].view(kind)[0])
    out = STATUS_FIELDS.zeros()[()]                 # np.void over a fresh 0-d array
    layout = R.STATUS_BLOCK if version == R.STATUS_VERSION_1 else R.STATUS_BLOCK_V2
    src = data.view(layout.dtype)[0]
    for name in set(src.dtype.names) - {"predictions", "checkpoint_sha256"}:
        out[name] = src[name]
    if version == R.STATUS_VERSION_1:
        out["predictions"] = src["predictions"]
        out["checkpoint_sha256"] = src["checkpoint_sha256"]
        return out
    packed = src["predictions"].astype(np.uint64)
    out["predictions"][:, 0] = packed & (R.PREDICTION_VALID_BIT - 1)
    out["predictions"][:, 1] = packed >> VALID_SHIFT
    out["checkpoint_sha256"][:R.DIGEST_PREFIX_BYTES] = src["checkpoint_sha256"]
    out["update_count"] = int(src["c0"]) + int(src["steps_completed"])
    return out


def _before_status(profile, steps: int) -> int:
    """Offset of the status block for a given profile and step count."""
    return RS.section_offsets(profile, steps, 0)["status"][0]


@dataclass
class ResultFile:
    """Typed sections of one result file.  Arrays are read-only views of a memory map."""
    path: str
    profile: object
    size: int
    expected_size: int
    steps: int                      # step windows in the file = status steps_completed
    issues: int                     # timestamp entries = status gpPut
    raw: np.ndarray = field(repr=False)                 # (size,) u8: the whole file
    forward: np.ndarray = field(repr=False)             # (3, V) f32
    losses: np.ndarray = field(repr=False)              # (steps, 1024) f32
    stat: np.void = field(repr=False)                   # STAT_RECORD
    loss_block: np.ndarray = field(repr=False)          # (4, 1024) f32
    final: np.ndarray = field(repr=False)               # (V,) f32
    semaphores: np.ndarray = field(repr=False)          # (3,) SEMAPHORE_SLOT
    error_notifier: np.void = field(repr=False)         # ERROR_NOTIFIER
    status: np.void = field(repr=False)                 # STATUS_FIELDS (either version, a copy)
    timestamps: np.ndarray = field(repr=False)          # (issues,) TIMESTAMP_ENTRY
    offsets: dict = field(repr=False, default_factory=dict)

    def section(self, name: str):
        """The typed view of a section, by its name in `coppelius.staging.result_sections`."""
        return getattr(self, ATTRIBUTES.get(name, name))

    @property
    def outcome_code(self) -> int:
        return int(self.status["outcome"])

    @property
    def outcome(self) -> str:
        return R.OUTCOMES[self.outcome_code]

    @property
    def steps_completed(self) -> int:
        return self.steps

    @property
    def status_version(self) -> int:
        return int(self.status["version"])

    def gpu_identity(self) -> dict:
        """Which GPU and host wrote the file (status block version 2; empty strings in a
        version-1 file, and for the GPU where no GPU ran): host name, GPU UUID, PCI bus id."""
        return run_identity(self.status)

    def checkpoint_digest(self) -> str:
        """The last published checkpoint's SHA-256 in hex as the file holds it: all 32 bytes
        (version 1), the first 8 (version 2)."""
        digest = np.asarray(self.status["checkpoint_sha256"])
        if self.status_version != R.STATUS_VERSION_1:
            digest = digest[:R.DIGEST_PREFIX_BYTES]
        return digest.tobytes().hex()

    def step_losses(self) -> np.ndarray:
        """(steps,) f64: the mean cross-entropy of each step (the quantity the update minimizes)."""
        return self.losses.mean(axis=1, dtype=np.float64)

    def update_entries(self) -> np.ndarray:
        """Timestamp entries of update issues whose fence was observed."""
        ts = self.timestamps
        keep = (ts["submission"] == L.SUBMISSION_UPDATE) & \
            ((ts["flags"] & R.FLAG_FENCE_OBSERVED) != 0)
        return ts[keep]

    def device_step_ns(self) -> np.ndarray:
        """(updates,) i64: device time per update step, final release − pre-launch release."""
        u = self.update_entries()
        return u["device_final_ns"].astype(np.int64) - u["device_prelaunch_ns"].astype(np.int64)

    def host_gaps_ns(self) -> np.ndarray:
        """(issues−1,) i64: host time from a fence observed to the next issue."""
        ts = self.timestamps
        if len(ts) < 2:
            return np.zeros(0, np.int64)
        return ts["host_issue_ns"][1:].astype(np.int64) - ts["host_fence_ns"][:-1].astype(np.int64)

    def update_steps(self) -> np.ndarray:
        """(updates,) i64: the step of each entry `update_entries` returns (device_step_ns's x)."""
        return self.update_entries()["step"].astype(np.int64)

    def update_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """((k,) step, (k,) ns): for each update issue after the first issue, the host time from
        the previous issue's fence (the forward's for step 0) to this issue."""
        ts = self.timestamps
        if len(ts) < 2:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        gap = ts["host_issue_ns"][1:].astype(np.int64) - ts["host_fence_ns"][:-1].astype(np.int64)
        upd = ts["submission"][1:] == L.SUBMISSION_UPDATE
        return ts["step"][1:][upd].astype(np.int64), gap[upd]

    def publication_steps(self) -> np.ndarray:
        """(k,) i64: the steps after which the run loop started a checkpoint publication, by
        host/run/loop.py's rule: every `checkpoint_interval` steps of this invocation, after its last
        planned step, and after the last completed step of an interrupted run.  The status
        block's `publications` counts those that completed, which are the first ones (each
        publication waits for the one before it)."""
        done, planned = self.steps, int(self.status["steps_planned"])
        s = np.arange(done, dtype=np.int64)
        started = ((s + 1) % self.profile.checkpoint_interval == 0) | (s + 1 == planned)
        if self.outcome_code == R.OUTCOME_INTERRUPTED and done:
            started[-1] = True
        return s[started]

    def warnings(self) -> list[str]:
        """Inconsistencies a valid-sized file can still carry; inspect shows them."""
        out = []
        st, n = self.status, self.error_notifier
        if self.outcome_code == R.OUTCOME_COMPLETED:
            if int(st["steps_completed"]) != int(st["steps_planned"]):
                out.append(f"outcome completed but steps_completed {int(st['steps_completed'])} "
                           f"≠ steps_planned {int(st['steps_planned'])}")
            if int(n["status"]) != R.NOTIFIER_STATUS_NONE:
                out.append("outcome completed but the error notifier holds an error")
        elif self.outcome_code == R.OUTCOME_INTERRUPTED:
            # an interruption fills the notifier with status 0 (CONTRACT §8): its time says so
            if int(n["time_ns"]) == 0:
                out.append("outcome interrupted but the error notifier is not filled")
            elif int(n["status"]) != R.NOTIFIER_STATUS_NONE:
                out.append("outcome interrupted but the error notifier holds an error")
        elif int(n["status"]) != R.NOTIFIER_STATUS_ERROR:
            out.append(f"outcome {self.outcome} but the error notifier is not filled")
        if int(st["gp_get"]) > int(st["gp_put"]):
            out.append(f"gpGet {int(st['gp_get'])} > gpPut {int(st['gp_put'])}")
        derived, published = self.publication_steps().size, int(st["publications"])
        if published > derived:
            out.append(f"status block counts {published} publications; the step count and the "
                       f"profile's interval allow {derived}")
        seq = self.timestamps["sequence"]
        if len(seq) and not np.array_equal(seq, np.arange(1, len(seq) + 1, dtype=seq.dtype)):
            out.append("timestamp table sequences are not 1, 2, 3, ...")
        for name, arr in (("forward part", self.forward), ("final part", self.final)):
            if arr.view(np.uint8)[:len(L.RECORD_MARKER)].tobytes() == L.RECORD_MARKER:
                out.append(f"the {name} still starts with the record marker: the device never "
                           "wrote it")
        return out


_NOT_RESULT = "name a result file written by `coppelius run`"
_CORRUPT = "the file is damaged; restore it from a copy, or rerun the run that wrote it"


def read(path) -> ResultFile:
    """Parse a result file of any profile and outcome; raise ResultFileError with one line.
    Opening never blocks (a FIFO or device is refused, not waited on)."""
    path = os.fspath(path)
    fd, st = paths.open_regular(path, "result file", ResultFileError,
                                {"not regular": _NOT_RESULT})
    try:
        size = st.st_size
        if size == 0:
            raise ResultFileError(f"{path}: empty file (0 bytes), not a result file",
                                  "a run killed before its first step window leaves this; "
                                  "rerun it (with --overwrite)")
        with paths.refusing("result file", path, "map", ResultFileError):
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    raw = np.frombuffer(mm, np.uint8)                                       # (size,)
    found = locate(raw, size)
    if not found:
        why, hint = _diagnose(mm, raw, size)
        raise ResultFileError(f"{path}: {why}", hint)
    if len(found) > 1:
        found = [c for c in found if int(c[3]["steps_planned"]) == c[0].steps] or found
    if len(found) > 1:
        names = ", ".join(f"{p.name} with {s} steps" for p, s, _, _ in found)
        raise ResultFileError(f"{path}: ambiguous: the file parses as {names}", _CORRUPT)
    prof, steps, issues, st = found[0]
    if int(st["version"]) not in R.STATUS_VERSIONS:
        known = " and ".join(str(v) for v in R.STATUS_VERSIONS)
        raise ResultFileError(f"{path}: status block version {int(st['version'])}, this reader "
                              f"knows versions {known}", "use a matching coppelius")
    if int(st["outcome"]) not in R.OUTCOMES:
        raise ResultFileError(f"{path}: status block outcome {int(st['outcome'])} is not one of "
                              f"{sorted(R.OUTCOMES)}", _CORRUPT)
    c0 = int(st["c0"])
    if c0 + steps > U64_MAX:        # the update count after the run: a u64, as checkpoints hold it
        raise ResultFileError(f"{path}: status block c0 {c0} + steps_completed {steps} = "
                              f"{c0 + steps} is past the largest update count 2⁶⁴ − 1",
                              _CORRUPT)
    return _views(path, raw, prof, steps, issues)


# a killed run's file holds logits and per-row losses: fp32 of modest size, or NaN/inf (a
# poisoned or diverged run); text or other binary read as fp32 has exponents far beyond this
KILLED_RUN_MAX_ABS = float(2 ** 32)


def recognize(path) -> str | None:
    """None when the file at `path` is one `coppelius run` writes at a result path (so that
    `--overwrite` may replace it): a result file this reader reads, an empty file, or the step
    windows of a run killed before its tail (a forward part and whole windows of some profile,
    holding fp32 values a run writes); else what it is instead, for the refusal."""
    try:
        found = read(path)
    except ResultFileError as e:
        why = e.message
    else:
        del found
        return None
    head = paths.head_bytes(path, len(CHECKPOINT_MAGIC))
    if head == CHECKPOINT_MAGIC:
        return f"it is a checkpoint (magic {CHECKPOINT_MAGIC.decode()})"
    if os.path.getsize(path) == 0:
        return None
    if _killed_run(path):
        return None
    return f"it is no file `coppelius run` writes ({why.split(': ', 1)[-1]})"


def _killed_run(path) -> bool:
    size = os.path.getsize(path)
    for prof in P.PROFILES.values():
        fwd = FORWARD.nbytes(prof, 0, 0)
        if size < fwd or (size - fwd) % STEPS.unit_bytes(prof):
            continue
        values = np.fromfile(path, "<f4")
        finite = np.abs(values[np.isfinite(values)])
        return not finite.size or float(finite.max()) < KILLED_RUN_MAX_ABS
    return False


def locate(raw: np.ndarray, size: int) -> list:
    """Every consistent (profile, steps, issues, status record); see the module docstring."""
    magic = np.frombuffer(R.STATUS_MAGIC, np.uint8)
    found = []
    for prof in P.PROFILES.values():
        entry, window = TIMESTAMPS.unit_bytes(prof), STEPS.unit_bytes(prof)   # 64, 4096 = 64·64
        rest = size - RS.result_file_bytes(prof, 0, 0)
        if rest < 0 or rest % entry:
            continue
        units = rest // entry
        steps = np.arange(units // (window // entry) + 1)                   # (n,)
        issues = units - (window // entry) * steps                          # (n,)
        at = size - entry * issues - STATUS.unit_bytes(prof)                # (n,) status offsets
        hit = (raw[at[:, None] + np.arange(magic.size)] == magic).all(axis=1)
        for k in np.flatnonzero(hit):
            st = R.STATUS_BLOCK.view(raw, 1, int(at[k]))[0]
            if int(st["steps_completed"]) == steps[k] and int(st["gp_put"]) == issues[k]:
                found.append((prof, int(steps[k]), int(issues[k]), st))
    return found


_TRUNCATED = ("the file was cut short (a full disk, an interrupted copy?); restore it from a copy "
              "or rerun")
_TRAILING = "something was appended to the file; restore it from a copy or rerun"
_NO_TAIL = ("a run killed (kill -9, a crash) before its tail keeps only its step windows; "
            "rerun it, or name a result file")


def _diagnose(mm: mmap.mmap, raw: np.ndarray, size: int) -> tuple[str, str]:
    """(one line that says why no consistent tail was found, a hint)."""
    if mm[:len(CHECKPOINT_MAGIC)] == CHECKPOINT_MAGIC:
        return (f"this is a checkpoint file (magic {CHECKPOINT_MAGIC.decode()}), not a result file",
                "`coppelius checkpoint show` reads checkpoints; name the run's --result file")
    smallest = min(RS.result_file_bytes(p, 0, 0) for p in P.PROFILES.values())
    at = mm.rfind(R.STATUS_MAGIC)
    status_bytes = R.STATUS_BLOCK.itemsize
    if at >= 0 and at + status_bytes <= size:
        st = R.STATUS_BLOCK.view(raw, 1, at)[0]
        steps, issues = int(st["steps_completed"]), int(st["gp_put"])
        claim = f"status block at offset {at:,} (steps_completed {steps}, gpPut {issues})"
        for prof in P.PROFILES.values():
            if _before_status(prof, steps) != at:
                continue
            want = RS.result_file_bytes(prof, steps, issues)
            if size > want:
                return (f"{size - want:,} trailing byte{'s' if size - want > 1 else ''} after "
                        f"the timestamp table: {claim} makes a {prof.name} result file of "
                        f"{want:,} bytes, this one has {size:,}", _TRAILING)
            return (f"truncated: {claim} makes a {prof.name} result file of {want:,} bytes, this "
                    f"one ends {want - size:,} bytes short, inside the timestamp table",
                    _TRUNCATED)
        where = ", ".join(f"{p.name} {_before_status(p, steps):,}" for p in P.PROFILES.values())
        return (f"{claim} is not where its own step count puts it ({where}): "
                "the file is corrupt or spliced", _CORRUPT)
    if at >= 0:
        return (f"truncated: a status block starts at offset {at:,} but the file ends "
                f"{at + status_bytes - size} bytes before its end", _TRUNCATED)
    guesses = []
    for prof in P.PROFILES.values():
        fwd = FORWARD.nbytes(prof, 0, 0)
        if size >= fwd:
            whole, part = divmod(size - fwd, STEPS.unit_bytes(prof))
            guesses.append(f"as {prof.name}: forward part + {whole:,} step windows"
                           + (f" + {part:,} bytes" if part else ""))
    guess = f" ({'; '.join(guesses)})" if guesses else ""
    if size < smallest:
        return (f"{size:,} bytes is shorter than any result file (the smallest, a tiny run with "
                f"no steps, is {smallest:,}) and holds no status block: not a result file, or a "
                f"run killed before writing its tail{guess}", _NO_TAIL)
    return (f"no status block (magic {R.STATUS_MAGIC.decode()}) anywhere: not a result file, or "
            f"a run killed before writing its tail{guess}", _NO_TAIL)


def _views(path, raw, prof, steps, issues) -> ResultFile:
    off = RS.section_offsets(prof, steps, issues)
    typed = {ATTRIBUTES.get(s.name, s.name): s.view(raw, off[s.name][0], prof, steps, issues)
             for s in RS.SECTIONS}
    at = off["status"][0]
    typed["status"] = status_fields(raw[at:at + STATUS.unit_bytes(prof)])
    return ResultFile(path=path, profile=prof, size=raw.size,
                      expected_size=RS.result_file_bytes(prof, steps, issues), steps=steps,
                      issues=issues, raw=raw, offsets=off, **typed)


def pci_bus_id(status) -> str:
    """The PCI bus id the way cuDeviceGetPCIBusId spells it ("0000:65:00.0"); "" when none."""
    if not int(status["identity_flags"]) & R.IDENTITY_GPU:
        return ""
    return pci_bus_id_text(*(int(status[f"pci_{k}"]) for k in ("domain", "bus", "device",
                                                                "function")))


def gpu_uuid(status) -> str:
    """The GPU's UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-…"); "" when none."""
    if not int(status["identity_flags"]) & R.IDENTITY_GPU:
        return ""
    return uuid_text(np.asarray(status["gpu_uuid"]).tobytes())


def run_identity(status) -> dict:
    """host_name (with "…" when the file keeps only its first bytes), gpu_uuid, pci_bus_id."""
    host = plain(status["host_name"])
    if int(status["identity_flags"]) & R.IDENTITY_HOST_TRUNCATED:
        host += "…"
    return {"host_name": host, "gpu_uuid": gpu_uuid(status), "pci_bus_id": pci_bus_id(status)}


def plain(value):
    """A record field as a plain Python value: bytes stripped of NULs and decoded, byte arrays as
    hex, other arrays as lists, numpy scalars as Python numbers."""
    if isinstance(value, bytes):
        return value.rstrip(b"\0").decode("ascii", "replace")
    if isinstance(value, np.ndarray):
        return value.tobytes().hex() if value.dtype == np.uint8 else value.tolist()
    return value.item() if hasattr(value, "item") else value


def record_dict(rec) -> dict:
    """A record (np.void) as plain Python values, field by field (see `plain`)."""
    return {name: plain(rec[name]) for name in rec.dtype.names}
