"""What a run writes about itself (CONTRACT §8–§9): the error notifier and what a failure leaves
in it, the stat record, the status block, the result file's tail.  The run loop (host/run/loop.py)
decides when; this module packs the bytes."""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coppelius.staging import layout as L
from coppelius.staging import paths
from coppelius.staging import records as R
from coppelius.staging.tokens import TokenCacheChanged

from coppelius.errors import DeviceError
from coppelius.checkpoints.publication import CheckpointWriteFailed
from coppelius.results.writer import ResultWriteError
from coppelius.staging.errors import UserError
from coppelius.run.ring import Ring

# how a run ends: the outcome in its status block and the process exit code (CONTRACT §2)
EXIT_COMPLETED = 0
EXIT_DEVICE_ERROR = 1
EXIT_INTERRUPTED = 3
EXIT_HOST_ERROR = 4
OUTCOME_EXIT = {R.OUTCOME_COMPLETED: EXIT_COMPLETED, R.OUTCOME_DEVICE_ERROR: EXIT_DEVICE_ERROR,
                R.OUTCOME_INTERRUPTED: EXIT_INTERRUPTED, R.OUTCOME_HOST_ERROR: EXIT_HOST_ERROR}


@dataclass
class Summary:
    """What one run did, for the command line and the status block."""
    outcome: int = R.OUTCOME_COMPLETED
    c0: int = 0
    steps_planned: int = 0
    steps_completed: int = 0
    publications: int = 0
    update_count: int = 0
    result: Path | None = None
    checkpoint: Path | None = None
    wall_s: float = 0.0
    losses: list = field(default_factory=list)
    error: str = ""

    @property
    def exit_code(self) -> int:
        return OUTCOME_EXIT[self.outcome]


class MarkerSurvived(Exception):
    """A record marker the submission should have overwritten is still there (CONTRACT §6)."""

    def __init__(self, name: str):
        super().__init__(f"{name} record marker survived")
        self.submission = L.SUBMISSIONS.index(name)


class TokenIdOnDevice(DeviceError):
    """The update's cross_entropy marked rows of the loss record (L.LOSS_BAD_ID): an input or
    target id outside [0, V) reached the kernels, though the host checked every id of the context
    before it staged them — so they changed between the check and the device (host memory, the
    staging region, the transfer).  The kernels read and wrote nothing outside their tensors for
    it (plan/kernels/norms.py embed_fwd, cross_entropy.py); the step's window is not appended and
    nothing of it is published."""

    def __init__(self, step: int, context: int, rows: np.ndarray, vocab: int):
        more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
        super().__init__(
            f"the update of step {step} (context {context}) saw a token id outside [0, {vocab}) "
            f"at row {rows[0]}{more}, though the host checked the context before staging it: the "
            "ids changed between the check and the device; nothing of this step was saved. Hint: "
            "`coppelius run` again continues from the checkpoint; if the fault repeats, "
            "`coppelius node --digests` compares this GPU with the others", code=R.INFO_TOKEN_ID)
        self.rows = rows
        self.reason = f"token id >= V: step {step} row {rows[0]}"


def check_loss_record(loss: np.ndarray, step: int, context: int, vocab: int) -> None:
    """Raise TokenIdOnDevice where the update marked a row.  One min over the 1,024 rows (a true
    ce is ≥ 0, a NaN compares false) and the rows only when one is marked: a full comparison and
    np.flatnonzero cost 12–18 µs a step here, the min ~3 (docs/PERFORMANCE.md)."""
    if loss.min() <= L.LOSS_BAD_ID:
        marked = np.flatnonzero(loss == np.float32(L.LOSS_BAD_ID))
        if marked.size:
            raise TokenIdOnDevice(step, context, marked, vocab)


NO_DRIVER_CODE = 0xFFFF         # notifier info32 of a device error without a CUresult
REASON_BYTES = R.ERROR_NOTIFIER.dtype["reason"].itemsize      # 40 ASCII bytes (CONTRACT §8)


class Notifier:
    """The error notifier in staging (CONTRACT §8): cleared at the start; the first failure, or an
    interruption, fills it once."""

    def __init__(self, record: np.void, ring: Ring):
        self.record, self.ring = record, ring
        for name in record.dtype.names:     # fill(0) would store the digit "0" in `reason`
            record[name] = b"" if record.dtype[name].kind == "S" else 0
        record["step"] = R.NOTIFIER_NO_STEP

    def fill(self, *, info32: int, submission: int, step: int | None, reason: str,
             status: int) -> None:
        n = self.record
        n["time_ns"] = time.clock_gettime_ns(time.CLOCK_REALTIME)
        n["info32"] = info32
        n["info16"] = submission
        n["status"] = status
        n["sequence"] = self.ring.gp_put
        n["step"] = R.NOTIFIER_NO_STEP if step is None else step
        n["reason"] = reason.encode("ascii", "replace")[:REASON_BYTES]


def current_submission(ring: Ring) -> int:
    if ring.gp_put == 0:
        return L.SUBMISSION_FORWARD
    return int(ring.table[ring.gp_put - 1]["submission"])


@dataclass(frozen=True)
class Failure:
    """What a failure leaves: the notifier's fields (`reason` puts the cause first, as 40 bytes
    keep only the start) and the summary's whole message."""
    outcome: int
    info32: int
    submission: int
    step: int | None
    reason: str
    message: str


def host_cause(e: BaseException) -> str:
    """The cause of a host failure in a few words, errno name first: 'ENOSPC writing chunk 1 of
    2' (a publication), 'EIO: Input/output error' (another OSError)."""
    if isinstance(e, CheckpointWriteFailed) and e.stage:
        return f"{paths.errno_name(e)} {e.stage}" if e.errno else e.stage
    if isinstance(e, ResultWriteError):
        return f"{paths.errno_name(e)} result file {e.stage}".rstrip()
    if isinstance(e, TokenCacheChanged):
        return e.reason
    if isinstance(e, OSError) and e.errno:
        return f"{paths.errno_name(e)}: {e.strerror}"
    return getattr(e, "message", None) or str(e)


def failure_of(e: BaseException, ring: Ring, step: int | None, during: str = "") -> Failure:
    """The notifier fields and summary message that a failure leaves."""
    if isinstance(e, MarkerSurvived):
        return Failure(R.OUTCOME_DEVICE_ERROR, R.INFO_MARKER_SURVIVED, e.submission, None,
                        str(e), str(e))
    if isinstance(e, TokenIdOnDevice):
        return Failure(R.OUTCOME_DEVICE_ERROR, e.code, current_submission(ring), step,
                       e.reason, str(e))
    if isinstance(e, DeviceError):
        return Failure(R.OUTCOME_DEVICE_ERROR, e.code or NO_DRIVER_CODE,
                        current_submission(ring), step, during + str(e), during + str(e))
    message = str(e)
    if isinstance(e, (ResultWriteError, TokenCacheChanged)):
        message = f"host error: {e}"
    elif isinstance(e, OSError) and not isinstance(e, UserError):
        message = f"host I/O: {paths.errno_text(e)}" + (f": {e.filename}" if e.filename else "")
    return Failure(R.OUTCOME_HOST_ERROR, R.INFO_HOST_IO, current_submission(ring), None,
                    host_cause(e), message)


def stat_record(inp, ring: Ring, views, payload_sha256: bytes) -> bytes:
    st = inp.restat()                   # the input as opened at the start, taken after the run
    return R.STAT_RECORD.pack(
        st_dev=st.st_dev, st_ino=st.st_ino, st_size=st.st_size, st_mode=st.st_mode,
        st_nlink=st.st_nlink, st_uid=st.st_uid, st_gid=st.st_gid, st_atime_ns=st.st_atime_ns,
        st_mtime_ns=st.st_mtime_ns, st_ctime_ns=st.st_ctime_ns, st_blocks=st.st_blocks,
        st_blksize=st.st_blksize, update_count=inp.update_count, gp_get=ring.gp_get,
        gp_put=ring.gp_put, semaphore_word=int(views.first_semaphore_word[0]),
        payload_sha256=np.frombuffer(payload_sha256, np.uint8))


def status_block(summary: Summary, ring: Ring, backend, views, checkpoint_sha256: bytes) -> bytes:
    """The status block, version 2 (FORMATS §4): the run's summary, the GPU and the host."""
    dev = backend.device()
    preds = views.predictions.astype(np.uint32)                     # (3, {token, valid})
    packed = preds[:, 0] | np.where(preds[:, 1] != 0, R.PREDICTION_VALID_BIT, 0).astype(np.uint32)
    gpu = backend.gpu_identity()
    host = host_name()
    flags = (R.IDENTITY_GPU if gpu is not None else 0) | \
        (R.IDENTITY_HOST_TRUNCATED if len(host) > R.HOST_NAME_BYTES else 0)
    domain, bus, device, function = gpu.pci_fields if gpu is not None else (0, 0, 0, 0)
    return R.STATUS_BLOCK_V2.pack(
        magic=R.STATUS_MAGIC, version=R.STATUS_VERSION, outcome=summary.outcome, c0=summary.c0,
        steps_planned=summary.steps_planned, steps_completed=summary.steps_completed,
        pci_domain=domain, pci_bus=bus, pci_device=device, pci_function=function,
        identity_flags=flags, gp_get=ring.gp_get, gp_put=ring.gp_put,
        publications=summary.publications, backend=backend.code,
        wall_ns=int(summary.wall_s * 1e9), predictions=packed,
        compute_capability=dev.compute_capability, driver_version=dev.driver_version,
        gpu_uuid=np.frombuffer(gpu.uuid if gpu is not None else bytes(16), np.uint8),
        checkpoint_sha256=np.frombuffer(checkpoint_sha256[:R.DIGEST_PREFIX_BYTES], np.uint8),
        host_name=host[:R.HOST_NAME_BYTES],
        device_name=dev.name.encode("ascii", "replace")[:R.DEVICE_NAME_BYTES])


def host_name() -> bytes:
    """This machine's name as ASCII (the status block keeps its first HOST_NAME_BYTES)."""
    return socket.gethostname().encode("ascii", "replace")


def tail_sections(views, stat: bytes, status: bytes, timestamps: np.ndarray) -> dict:
    """The result file's tail (CONTRACT §9): the stat record and status block the host packs, the
    rest copied from the staging views as the run left them."""
    return dict(stat=stat, loss_block=views.loss_block, final_part=views.record_final,
                semaphores=views.semaphores, error_notifier=views.error_notifier,
                status=status, timestamps=timestamps)


def saved_report(summary: Summary, published: int | None, result_saved: str) -> str:
    """What a host error left and what it lost, for the command's last lines: the checkpoint's
    update count (the last completed publication, or the input untouched) and the result file's
    state (`result_saved`, the run loop's words), then the updates no checkpoint holds."""
    kept = summary.c0 if published is None else published
    how = ("untouched: no publication completed" if published is None
           else "its last completed publication")
    lines = [f"saved: checkpoint {summary.checkpoint} at update count {kept} ({how}); "
             f"result file {summary.result}: {result_saved}"]
    lost = []
    if summary.update_count > kept:
        lost.append(f"updates {kept + 1}..{summary.update_count} (trained, not published: "
                    "a rerun from the checkpoint trains them again)")
    if summary.steps_completed < summary.steps_planned:
        lost.append(f"steps {summary.steps_completed}..{summary.steps_planned - 1} of this run "
                    "(not completed)")
    lines.append("not saved: " + ("; ".join(lost) if lost else "nothing"))
    return "\n".join(lines)
