"""The result file (SPEC §8–§9) in one place: the progressive writer, the reader, a synthetic builder.

Layout, in the order the run writes it (F = 3·V·4, sizes from `staging.layout`):

    forward part (F) | step windows (4096 × steps) | stat (160) | loss block (16384) |
    final part (V·4) | semaphore region (32 × 3) | error notifier (64) | status block (160) |
    timestamp table (64 × issues)

How the reader recovers profile, steps and issues from nothing but the file: for each profile,
R = size − F − (fixed tail bytes) must be 4096·s + 64·i with s, i ≥ 0.  Since 4096 = 64·64, every
s in 0..R//4096 gives one i, and with it one position for the status block (size − 64·i − 160).
A position is *consistent* when it holds the magic `COPPSTAT` and the block's own steps_completed
and gpPut equal s and i (gpPut counts issues; the table has one entry per issue).  The magic test
runs over all candidate positions at once (≤ 10,001 for a production run).  Exactly one consistent
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

from plan import profiles as P
from staging import layout as L
from staging import records as R

from .errors import UserError

SEMAPHORE_SLOTS = len(L.SUBMISSIONS)
ENTRIES_PER_WINDOW = L.STEP_WINDOW_BYTES // L.TIMESTAMP_ENTRY_BYTES   # 64: one window = 64 entries
ROW_WORDS = L.STEP_WINDOW_BYTES // 4                                  # 1024 rows a step
SECTIONS = ("forward", "steps", "stat", "loss_block", "final", "semaphores", "error_notifier",
            "status", "timestamps")


class ResultRefused(UserError):
    """The result path cannot be created (exists without overwrite, missing directory, ...)."""


class ResultWriteError(UserError):
    """Writing or syncing the result file failed (disk full, I/O error)."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None):
        super().__init__(message, hint)
        self.errno = errno


class ResultFileError(UserError):
    """A file is not a readable result file; the message says precisely why, in one line."""


def section_sizes(profile, steps: int, issues: int) -> dict[str, int]:
    """Bytes of each section, in file order."""
    return {"forward": L.record_forward_bytes(profile),
            "steps": L.STEP_WINDOW_BYTES * steps,
            "stat": L.STAT_RECORD_BYTES,
            "loss_block": L.LOSS_BLOCK_BYTES,
            "final": L.record_final_bytes(profile),
            "semaphores": L.SEMAPHORE_REGION_BYTES,
            "error_notifier": L.ERROR_NOTIFIER_BYTES,
            "status": L.STATUS_BLOCK_BYTES,
            "timestamps": L.TIMESTAMP_ENTRY_BYTES * issues}


def section_offsets(profile, steps: int, issues: int) -> dict[str, tuple[int, int]]:
    """name → (offset, size) for every section, in file order."""
    out, at = {}, 0
    for name, size in section_sizes(profile, steps, issues).items():
        out[name] = (at, size)
        at += size
    return out


def _before_status(profile, steps: int) -> int:
    """Offset of the status block for a given profile and step count."""
    return section_offsets(profile, steps, 0)["status"][0]


# ------------------------------------------------------------------------------------------ writer
def _as_bytes(data) -> memoryview:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return memoryview(data).cast("B")


class ResultWriter:
    """Writes a result file as the run goes: forward part, one window per observed fence, tail.

    Each `append_step` reaches the file with one os.write at once, so a killed run's file holds
    every observed step; nothing is fsynced until `close` (file, then directory).
    """

    def __init__(self, fd: int, path: str, profile):
        self._fd: int | None = fd
        self.path = path
        self.profile = profile
        self.forward_written = False
        self.tail_written = False
        self.steps_written = 0
        self.bytes_written = 0

    @classmethod
    def create(cls, path, profile, overwrite: bool = False) -> "ResultWriter":
        path = os.fspath(path)
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        flags |= os.O_TRUNC if overwrite else os.O_EXCL
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            raise ResultRefused(f"result file {path} already exists; refusing to overwrite it",
                                "pass --overwrite to replace it, or choose another --result") from None
        except OSError as e:
            raise ResultRefused(f"cannot create result file {path}: {e.strerror}",
                                "check that its directory exists and is writable") from None
        return cls(fd, path, profile)

    # -- the three parts, in order --
    def write_forward(self, part) -> None:
        self._need_open()
        if self.forward_written:
            raise RuntimeError("result file: the forward part is already written")
        self._write(_exact(part, L.record_forward_bytes(self.profile), "forward part"))
        self.forward_written = True

    def append_step(self, window) -> None:
        self._need_open()
        if not self.forward_written or self.tail_written:
            raise RuntimeError("result file: a step window goes after the forward part and "
                               "before the tail")
        self._write(_exact(window, L.STEP_WINDOW_BYTES, "step window"))
        self.steps_written += 1

    def write_tail(self, stat, loss_block, final_part, semaphores, error_notifier, status,
                   timestamps) -> None:
        """The tail, checked against the steps written so that the reader can find it again."""
        self._need_open()
        if not self.forward_written or self.tail_written:
            raise RuntimeError("result file: the tail goes once, after the forward part")
        prof = self.profile
        ts = _as_bytes(timestamps)
        if len(ts) % L.TIMESTAMP_ENTRY_BYTES:
            raise ValueError(f"result tail: timestamp table of {len(ts)} bytes is not a whole "
                             f"number of {L.TIMESTAMP_ENTRY_BYTES}-byte entries")
        issues = len(ts) // L.TIMESTAMP_ENTRY_BYTES
        st = _exact(status, L.STATUS_BLOCK_BYTES, "status block")
        fields = R.STATUS_BLOCK.unpack(st)
        problems = []
        if fields["magic"] != R.STATUS_MAGIC:
            problems.append(f"magic {fields['magic']!r} is not {R.STATUS_MAGIC!r}")
        if fields["steps_completed"] != self.steps_written:
            problems.append(f"steps_completed {fields['steps_completed']} but "
                            f"{self.steps_written} step windows were written")
        if fields["gp_put"] != issues:
            problems.append(f"gp_put {fields['gp_put']} but the timestamp table has "
                            f"{issues} entries")
        if problems:
            raise ValueError("result tail: status block inconsistent with the file: "
                             + "; ".join(problems))
        parts = [_exact(stat, L.STAT_RECORD_BYTES, "stat record"),
                 _exact(loss_block, L.LOSS_BLOCK_BYTES, "loss block"),
                 _exact(final_part, L.record_final_bytes(prof), "final part"),
                 _exact(semaphores, L.SEMAPHORE_REGION_BYTES, "semaphore region"),
                 _exact(error_notifier, L.ERROR_NOTIFIER_BYTES, "error notifier"),
                 st, ts]
        self._write(b"".join(parts))     # ~66 KB + 64·issues: one write
        self.tail_written = True

    # -- lifetime --
    def close(self) -> None:
        """fsync the file, close it, fsync its directory (so the name survives a crash)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as e:
            raise ResultWriteError(f"cannot sync result file {self.path}: {e.strerror}",
                                   "check the disk", e.errno) from None
        finally:
            os.close(fd)
        _fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _need_open(self) -> None:
        if self._fd is None:
            raise RuntimeError(f"result file {self.path} is closed")

    def _write(self, data) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                self.bytes_written += n
        except OSError as e:
            raise ResultWriteError(f"cannot write result file {self.path}: {e.strerror}",
                                   "free space on its file system", e.errno) from None


def _exact(data, size: int, what: str) -> memoryview:
    view = _as_bytes(data)
    if len(view) != size:
        raise ValueError(f"result file: {what} is {len(view)} bytes, expected {size}")
    return view


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass    # some file systems refuse fsync on directories (EINVAL); the data is synced
    finally:
        os.close(dfd)


# ------------------------------------------------------------------------------------------ reader
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
    status: np.void = field(repr=False)                 # STATUS_BLOCK
    timestamps: np.ndarray = field(repr=False)          # (issues,) TIMESTAMP_ENTRY
    offsets: dict = field(repr=False, default_factory=dict)

    @property
    def outcome_code(self) -> int:
        return int(self.status["outcome"])

    @property
    def outcome(self) -> str:
        return R.OUTCOMES[self.outcome_code]

    @property
    def steps_completed(self) -> int:
        return self.steps

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
        elif int(n["status"]) != R.NOTIFIER_STATUS_ERROR:
            out.append(f"outcome {self.outcome} but the error notifier is not filled")
        if int(st["gp_get"]) > int(st["gp_put"]):
            out.append(f"gpGet {int(st['gp_get'])} > gpPut {int(st['gp_put'])}")
        seq = self.timestamps["sequence"]
        if len(seq) and not np.array_equal(seq, np.arange(1, len(seq) + 1, dtype=seq.dtype)):
            out.append("timestamp table sequences are not 1, 2, 3, ...")
        for name, arr in (("forward part", self.forward), ("final part", self.final)):
            if arr.view(np.uint8)[:len(L.RECORD_MARKER)].tobytes() == L.RECORD_MARKER:
                out.append(f"the {name} still starts with the record marker: the device never "
                           "wrote it")
        return out


def read(path) -> ResultFile:
    """Parse a result file of any profile and outcome; raise ResultFileError with one line."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ResultFileError(f"{path}: empty file (0 bytes), not a result file",
                                      "a run that died before its forward part leaves this")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ResultFileError(f"{path}: cannot read: {e.strerror}") from None
    raw = np.frombuffer(mm, np.uint8)                                       # (size,)
    found = _locate(raw, size)
    if not found:
        raise ResultFileError(f"{path}: {_diagnose(mm, raw, size)}")
    if len(found) > 1:
        found = [c for c in found if int(c[3]["steps_planned"]) == c[0].steps] or found
    if len(found) > 1:
        names = ", ".join(f"{p.name} with {s} steps" for p, s, _, _ in found)
        raise ResultFileError(f"{path}: ambiguous: the file parses as {names}")
    prof, steps, issues, st = found[0]
    if int(st["version"]) != R.STATUS_VERSION:
        raise ResultFileError(f"{path}: status block version {int(st['version'])}, this reader "
                              f"knows version {R.STATUS_VERSION}", "use a matching coppelius")
    if int(st["outcome"]) not in R.OUTCOMES:
        raise ResultFileError(f"{path}: status block outcome {int(st['outcome'])} is not one of "
                              f"{sorted(R.OUTCOMES)}")
    return _views(path, raw, prof, steps, issues)


def _locate(raw: np.ndarray, size: int) -> list:
    """Every consistent (profile, steps, issues, status record); see the module docstring."""
    magic = np.frombuffer(R.STATUS_MAGIC, np.uint8)
    found = []
    for prof in P.PROFILES.values():
        rest = size - L.record_forward_bytes(prof) - L.result_tail_bytes(prof, 0)
        if rest < 0 or rest % L.TIMESTAMP_ENTRY_BYTES:
            continue
        units = rest // L.TIMESTAMP_ENTRY_BYTES
        steps = np.arange(units // ENTRIES_PER_WINDOW + 1)                  # (n,)
        issues = units - ENTRIES_PER_WINDOW * steps                         # (n,)
        at = size - L.TIMESTAMP_ENTRY_BYTES * issues - L.STATUS_BLOCK_BYTES  # (n,) status offsets
        hit = (raw[at[:, None] + np.arange(magic.size)] == magic).all(axis=1)
        for k in np.flatnonzero(hit):
            st = R.STATUS_BLOCK.view(raw, 1, int(at[k]))[0]
            if int(st["steps_completed"]) == steps[k] and int(st["gp_put"]) == issues[k]:
                found.append((prof, int(steps[k]), int(issues[k]), st))
    return found


CHECKPOINT_MAGIC = b"CPLSCKPT"   # SPEC §10: recognized only to name it in the refusal


def _diagnose(mm: mmap.mmap, raw: np.ndarray, size: int) -> str:
    """One line that says why no consistent tail was found."""
    if mm[:len(CHECKPOINT_MAGIC)] == CHECKPOINT_MAGIC:
        return "this is a checkpoint file (magic CPLSCKPT), not a result file"
    smallest = min(L.result_file_bytes(p, 0, 0) for p in P.PROFILES.values())
    at = mm.rfind(R.STATUS_MAGIC)
    if at >= 0 and at + L.STATUS_BLOCK_BYTES <= size:
        st = R.STATUS_BLOCK.view(raw, 1, at)[0]
        steps, issues = int(st["steps_completed"]), int(st["gp_put"])
        claim = f"status block at offset {at:,} (steps_completed {steps}, gpPut {issues})"
        for prof in P.PROFILES.values():
            if _before_status(prof, steps) != at:
                continue
            want = L.result_file_bytes(prof, steps, issues)
            if size > want:
                return (f"{size - want:,} trailing byte{'s' if size - want > 1 else ''} after the timestamp table: {claim} "
                        f"makes a {prof.name} result file of {want:,} bytes, this one has {size:,}")
            return (f"truncated: {claim} makes a {prof.name} result file of {want:,} bytes, this "
                    f"one ends {want - size:,} bytes short, inside the timestamp table")
        where = ", ".join(f"{p.name} {_before_status(p, steps):,}" for p in P.PROFILES.values())
        return (f"{claim} is not where its own step count puts it ({where}): "
                "the file is corrupt or spliced")
    if at >= 0:
        return (f"truncated: a status block starts at offset {at:,} but the file ends "
                f"{at + L.STATUS_BLOCK_BYTES - size} bytes before its end")
    guesses = []
    for prof in P.PROFILES.values():
        fwd = L.record_forward_bytes(prof)
        if size >= fwd:
            whole, part = divmod(size - fwd, L.STEP_WINDOW_BYTES)
            guesses.append(f"as {prof.name}: forward part + {whole:,} step windows"
                           + (f" + {part:,} bytes" if part else ""))
    guess = f" ({'; '.join(guesses)})" if guesses else ""
    if size < smallest:
        return (f"{size:,} bytes is shorter than any result file (the smallest, a tiny run with "
                f"no steps, is {smallest:,}) and holds no status block: not a result file, or a "
                f"run killed before writing its tail{guess}")
    return ("no status block (magic COPPSTAT) anywhere: not a result file, or a run killed "
            f"before writing its tail{guess}")


def _views(path, raw, prof, steps, issues) -> ResultFile:
    off = section_offsets(prof, steps, issues)

    def sect(name):
        o, n = off[name]
        return raw[o:o + n]

    V = prof.vocab
    return ResultFile(
        path=path, profile=prof, size=raw.size,
        expected_size=L.result_file_bytes(prof, steps, issues), steps=steps, issues=issues,
        raw=raw, offsets=off,
        forward=sect("forward").view("<f4").reshape(L.RECORD_FORWARD_ROWS, V),
        losses=sect("steps").view("<f4").reshape(steps, ROW_WORDS),
        stat=R.STAT_RECORD.view(sect("stat"), 1)[0],
        loss_block=sect("loss_block").view("<f4").reshape(L.LOSS_WINDOWS, L.LOSS_WINDOW_WORDS),
        final=sect("final").view("<f4"),
        semaphores=R.SEMAPHORE_SLOT.view(sect("semaphores"), SEMAPHORE_SLOTS),
        error_notifier=R.ERROR_NOTIFIER.view(sect("error_notifier"), 1)[0],
        status=R.STATUS_BLOCK.view(sect("status"), 1)[0],
        timestamps=R.TIMESTAMP_ENTRY.view(sect("timestamps"), issues))


def record_dict(rec) -> dict:
    """A record (np.void) as plain Python values: bytes fields stripped of NULs and decoded,
    byte arrays as hex."""
    out = {}
    for name in rec.dtype.names:
        v = rec[name]
        if isinstance(v, bytes):
            out[name] = v.rstrip(b"\0").decode("ascii", "replace")
        elif isinstance(v, np.ndarray):
            out[name] = v.tobytes().hex() if v.dtype == np.uint8 else v.tolist()
        else:
            out[name] = v.item()
    return out


# ------------------------------------------------------------------------------- synthetic files
@dataclass
class Synthetic:
    """Every part of a result file, as the run loop would hand them to the writer."""
    profile: object
    forward: bytes
    windows: np.ndarray         # (steps, 1024) f32
    stat: bytes
    loss_block: bytes
    final: bytes
    semaphores: bytes
    error_notifier: bytes
    status: bytes
    timestamps: bytes

    def write(self, path, overwrite: bool = False) -> None:
        with ResultWriter.create(path, self.profile, overwrite=overwrite) as w:
            w.write_forward(self.forward)
            for row in self.windows:
                w.append_step(row)
            w.write_tail(self.stat, self.loss_block, self.final, self.semaphores,
                         self.error_notifier, self.status, self.timestamps)

    def expected_bytes(self) -> bytes:
        return b"".join([self.forward, self.windows.tobytes(), self.stat, self.loss_block,
                         self.final, self.semaphores, self.error_notifier, self.status,
                         self.timestamps])


def synthesize(profile, outcome: int = R.OUTCOME_COMPLETED, steps: int | None = None,
               seed: int = 0, c0: int = 0) -> Synthetic:
    """A plausible result file for tests and demos: a decaying loss curve with noise, realistic
    timestamps (≈ 50 ms device time a step), and the tail the run loop writes for `outcome`.
    `steps` is the completed step count (default: all for completed, half otherwise)."""
    rng = np.random.default_rng(seed)
    V, planned = profile.vocab, profile.steps
    if steps is None:
        steps = planned if outcome == R.OUTCOME_COMPLETED else planned // 2
    # issues: forward, the completed updates, then per outcome the failed update / the final
    failed_update = outcome == R.OUTCOME_DEVICE_ERROR
    final_issued = outcome in (R.OUTCOME_COMPLETED, R.OUTCOME_INTERRUPTED)
    issues = 1 + steps + int(failed_update) + int(final_issued)
    gp_get = issues - int(failed_update)

    t = np.arange(steps, dtype=np.float64)[:, None]
    floor = 0.6 * np.log(V)
    curve = floor + (np.log(V) - floor) * np.exp(-t / max(planned / 8, 1))
    noise = rng.standard_normal((steps, ROW_WORDS), dtype=np.float32)      # (steps, 1024)
    windows = (curve.astype(np.float32) * np.abs(1 + np.float32(0.3) * noise)).astype("<f4")
    forward = rng.normal(0, 2, (L.RECORD_FORWARD_ROWS, V)).astype("<f4")
    final = rng.normal(0, 3, V).astype("<f4")
    loss_block = rng.normal(0, 1, (L.LOSS_WINDOWS, L.LOSS_WINDOW_WORDS)).astype("<f4")
    if steps:
        loss_block[L.W0_LAST_CE] = windows[-1]

    # timestamps: host issue → device pre-launch (+20 µs) → final (+~50 ms) → fence (+30 µs)
    ts = np.zeros(issues, R.TIMESTAMP_ENTRY.dtype)
    sub = np.full(issues, L.SUBMISSION_UPDATE, np.uint32)
    sub[0] = L.SUBMISSION_FORWARD
    if final_issued:
        sub[-1] = L.SUBMISSION_FINAL
    step = np.full(issues, R.TIMESTAMP_NO_STEP, np.uint32)
    upd = np.flatnonzero(sub == L.SUBMISSION_UPDATE)
    step[upd] = np.arange(upd.size)
    dev = np.where(sub == L.SUBMISSION_UPDATE, 50e6, 15e6) * rng.lognormal(0, 0.05, issues)
    gap = rng.gamma(4.0, 10e3, issues)                      # host gap ≈ 40 µs
    issue_ns = 1_000_000_000 + np.cumsum(np.concatenate([[0], (dev + 50e3 + gap)[:-1]]))
    ts["submission"], ts["sequence"], ts["step"] = sub, np.arange(1, issues + 1), step
    ts["context"] = c0 + np.where(step == R.TIMESTAMP_NO_STEP, max(steps - 1, 0) * final_issued,
                                  step)
    ts["context"][0] = c0
    ts["host_issue_ns"] = issue_ns
    ts["device_prelaunch_ns"] = 5_000_000_000_000 + issue_ns + 20e3
    ts["device_final_ns"] = ts["device_prelaunch_ns"] + dev
    ts["host_fence_ns"] = issue_ns + dev + 50e3
    ts["host_wall_issue_ns"] = 1_795_000_000_000_000_000 + issue_ns
    ts["flags"] = R.FLAG_FENCE_OBSERVED
    if failed_update:
        ts["flags"][-1] = R.FLAG_ERROR
        ts["host_fence_ns"][-1] = 0
        ts["device_final_ns"][-1] = 0

    sems = np.zeros(SEMAPHORE_SLOTS, R.SEMAPHORE_SLOT.dtype)
    for s in range(SEMAPHORE_SLOTS):
        mine = np.flatnonzero(sub == s)
        if mine.size:
            last = ts[mine[-1]]
            sems[s]["prelaunch_payload"] = last["sequence"]
            sems[s]["prelaunch_timestamp"] = last["device_prelaunch_ns"]
            if last["flags"] & R.FLAG_FENCE_OBSERVED:
                sems[s]["final_payload"] = last["sequence"]
                sems[s]["final_timestamp"] = last["device_final_ns"]

    wall = int(ts["host_fence_ns"].max() - issue_ns[0]) + 3_000_000_000
    preds = rng.integers(0, V, (3, 2)).astype(np.uint32)
    preds[:, 1] = 1
    digest = rng.integers(0, 256, 32, dtype=np.uint8)
    status = R.STATUS_BLOCK.pack(
        magic=R.STATUS_MAGIC, version=R.STATUS_VERSION, outcome=outcome, c0=c0,
        steps_planned=planned, steps_completed=steps, update_count=c0 + steps,
        gp_get=gp_get, gp_put=issues, publications=steps // profile.checkpoint_interval
        + int(outcome == R.OUTCOME_INTERRUPTED), backend=R.BACKEND_CUDA, wall_ns=wall,
        predictions=preds, compute_capability=90, driver_version=12080, checkpoint_sha256=digest,
        device_name="NVIDIA H200")
    if outcome == R.OUTCOME_COMPLETED:
        notifier = R.ERROR_NOTIFIER.pack(step=R.NOTIFIER_NO_STEP)
    else:
        info, why = {R.OUTCOME_DEVICE_ERROR: (700, "CUDA_ERROR_ILLEGAL_ADDRESS in update"),
                     R.OUTCOME_INTERRUPTED: (0, "interrupted by SIGINT"),
                     R.OUTCOME_HOST_ERROR: (R.INFO_HOST_IO, "host I/O: No space left on device")
                     }[outcome]
        failed_step = steps if outcome != R.OUTCOME_INTERRUPTED else R.NOTIFIER_NO_STEP
        notifier = R.ERROR_NOTIFIER.pack(
            time_ns=1_795_000_000_000_000_000 + wall, info32=info,
            info16=L.SUBMISSION_UPDATE, status=R.NOTIFIER_STATUS_ERROR,
            sequence=issues if failed_update else 0, step=failed_step, reason=why)
    stat = R.STAT_RECORD.pack(
        st_dev=2049, st_ino=131072 + seed, st_size=0, st_mode=0o100644, st_nlink=1, st_uid=1000,
        st_gid=1000, st_atime_ns=1_795_000_000_000_000_000, st_mtime_ns=1_795_000_000_000_000_000,
        st_ctime_ns=1_795_000_000_000_000_000, st_blocks=0, st_blksize=4096, update_count=c0,
        gp_get=gp_get, gp_put=issues, semaphore_word=int(sems[0]["final_payload"]))
    return Synthetic(profile=profile, forward=forward.tobytes(), windows=windows, stat=stat,
                     loss_block=loss_block.tobytes(), final=final.tobytes(),
                     semaphores=sems.tobytes(), error_notifier=notifier, status=status,
                     timestamps=ts.tobytes())
