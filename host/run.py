"""The run loop: one invocation = lock, validate, load or initialize, forward, N updates, final, tail.

SPEC §2 and §7–§9.  The host never computes model math here: it stages inputs, rings the doorbell,
waits on fences, appends each step's loss window to the result file, publishes checkpoints through
the transfer window, and writes the tail — on completion, device failure, host failure or interruption.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plan import profiles
from staging import layout as L
from staging import records as R

from .backend import DeviceError
from .errors import UserError

DEFAULT_DIRECTORY = Path("coppelius-run")
SWITCH_INTERVAL_S = 2e-4    # GIL hand-over bound while a publisher thread runs beside the loop

EXIT_COMPLETED = 0
EXIT_DEVICE_ERROR = 1
EXIT_INTERRUPTED = 3
EXIT_HOST_ERROR = 4
OUTCOME_EXIT = {R.OUTCOME_COMPLETED: EXIT_COMPLETED, R.OUTCOME_DEVICE_ERROR: EXIT_DEVICE_ERROR,
                R.OUTCOME_INTERRUPTED: EXIT_INTERRUPTED, R.OUTCOME_HOST_ERROR: EXIT_HOST_ERROR}


class RunRefused(UserError):
    pass


@dataclass
class Request:
    profile: profiles.Profile
    tokens: Path | None = None          # None: the embedded default stream
    checkpoint: Path | None = None      # None: <directory>/<profile>.ckpt (created empty if missing)
    result: Path | None = None          # None: <directory>/<profile>-result-c<c0>.bin
    backend: str = "cuda"
    source: Path | None = None          # the token cache's source file, if its header must match
    overwrite: bool = False
    fence_timeout_s: float = 120.0
    directory: Path = DEFAULT_DIRECTORY
    steps: int | None = None            # only for tests: fewer steps than the profile's


@dataclass
class Summary:
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


class Progress:
    """Live progress hooks; the command line passes a rich implementation, tests pass this one."""

    def start(self, summary: Summary, floor: float | None, tokens_per_step: int) -> None: ...
    def step(self, step: int, loss: float) -> None: ...
    def published(self, update_count: int, seconds: float) -> None: ...
    def note(self, text: str) -> None: ...
    def stop(self) -> None: ...


class _Signals:
    """SIGINT/SIGTERM set a flag; the loop finishes the step in flight, publishes and stops."""

    def __init__(self, progress: Progress):
        self.received: int | None = None
        self.progress = progress
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is None:
            self.progress.note(f"{signal.Signals(signum).name}: finishing the step in flight, "
                               "then publishing")
        self.received = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def make_backend(name: str, profile):
    if name == "cuda":
        from .backend_cuda import CudaBackend
        return CudaBackend(profile)
    if name == "interpret":
        try:
            from .backend_interpret import InterpretBackend
        except ImportError as e:
            raise RunRefused(f"the interpret backend needs Triton and torch ({e})",
                             "pip install -e '.[dev]'") from None
        return InterpretBackend(profile)
    raise RunRefused(f"unknown backend {name!r}", "use --backend cuda or --backend interpret")


def _resolve_paths(req: Request):
    """Default stream, checkpoint and result paths for `coppelius run` with no arguments."""
    from staging import synthetic
    tokens = req.tokens
    if tokens is None:
        tokens = synthetic.ensure_default_stream(req.profile, req.directory)
    ckpt = req.checkpoint
    if ckpt is None:
        req.directory.mkdir(parents=True, exist_ok=True)
        ckpt = req.directory / f"{req.profile.name}.ckpt"
        if not ckpt.exists():
            ckpt.touch()            # the embedded default starts fresh; a named path never does
    if req.result is None:
        req.directory.mkdir(parents=True, exist_ok=True)
    return Path(tokens), Path(ckpt)


def run(req: Request, progress: Progress | None = None) -> Summary:
    from staging.tokens import TokenCache

    from . import checkpoint as ckpt_mod
    from .result_file import ResultWriter

    progress = progress or Progress()
    profile = req.profile
    steps = profile.steps if req.steps is None else req.steps
    if not 0 < steps <= profile.steps:
        raise RunRefused(f"--steps {steps} is outside 1..{profile.steps}")
    tokens_path, ckpt_path = _resolve_paths(req)

    ckpt_mod.open_input(ckpt_path, profile).close()  # refuse a missing or foreign path before locking
    with ckpt_mod.lock(ckpt_path), ckpt_mod.open_input(ckpt_path, profile) as inp:
        c0 = inp.update_count
        cache = TokenCache.open(tokens_path, profile)
        cache.validate_run(c0, steps, source=None if req.source is None else str(req.source))
        result_path = req.result or (req.directory / f"{profile.name}-result-c{c0}.bin")
        if result_path.exists() and not req.overwrite:
            raise RunRefused(f"result file {result_path} exists",
                             "pass --overwrite, or name another --result")
        backend = make_backend(req.backend, profile)
        with backend:
            with ResultWriter.create(result_path, profile, overwrite=req.overwrite) as writer:
                return _run_on(req, profile, steps, backend, cache, inp, c0, ckpt_path, writer,
                               result_path, progress)


class Publisher:
    """Publishes checkpoints from a device-side snapshot on a thread while training goes on.

    `start(n)` waits for the publication in flight, snapshots the payload on the device (between
    two updates, ~0.25 ms for 692 MB on an H200), and streams the snapshot through the transfer
    window on a thread; the step loop keeps issuing updates meanwhile.  `wait()` joins it and
    re-raises its error.  Publishing is ~2 s per 692 MB checkpoint on the 2-core CI machine
    (docs/PERFORMANCE.md, issue 5): ten of them would otherwise stop the GPU for longer than the
    10,000 steps take.
    """

    def __init__(self, backend, ckpt_path, profile, summary, progress):
        self.backend, self.path, self.profile = backend, ckpt_path, profile
        self.summary, self.progress = summary, progress
        self.transfer = backend.staging.transfer
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.sha256 = bytes(32)              # of the last published file (the status block's)
        self.update_count: int | None = None  # of the last publication started

    def start(self, update_count: int) -> None:
        self.wait()
        self.backend.snapshot()
        self.update_count = update_count
        self.thread = threading.Thread(target=self._publish, args=(update_count,),
                                       name=f"publish-{update_count}", daemon=True)
        self.thread.start()

    def _publish(self, update_count: int) -> None:
        from . import checkpoint as ckpt_mod
        t = time.monotonic()
        try:
            pub = ckpt_mod.publish_chunks(
                self.path, self.profile, update_count,
                lambda off, n, out: self.backend.download_snapshot_chunk(off, n),
                transfer=self.transfer)
        except BaseException as e:          # re-raised by wait() on the run loop's thread
            self.error = e
            return
        self.sha256 = pub.sha256
        self.summary.publications += 1
        self.progress.published(update_count, time.monotonic() - t)

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            e, self.error = self.error, None
            raise e


def _upload_fresh(backend, profile) -> None:
    """Fresh initialization (SPEC §4) through the transfer window: P drawn, M = V = 0."""
    from plan import reference
    transfer = backend.staging.transfer
    P = reference.init_parameters(profile)                          # (N,) fp32
    payload = P.view(np.uint8)
    for off in range(0, profile.payload_bytes, L.TRANSFER_WINDOW_BYTES):
        n = min(L.TRANSFER_WINDOW_BYTES, profile.payload_bytes - off)
        k = min(n, max(0, payload.size - off))                       # bytes of P in this chunk
        transfer[:k] = payload[off:off + k]
        transfer[k:n] = 0
        backend.upload_chunk(off, n)


def _run_on(req, profile, steps, backend, cache, inp, c0, ckpt_path, writer, result_path,
            progress) -> Summary:
    from . import checkpoint as ckpt_mod
    from .ring import Ring

    t_start = time.monotonic()
    views = backend.staging
    dev = backend.device()
    summary = Summary(c0=c0, steps_planned=steps, update_count=c0, result=result_path,
                      checkpoint=ckpt_path)
    ring = Ring(backend, capacity=steps + 2, timeout_s=req.fence_timeout_s)
    publisher = Publisher(backend, ckpt_path, profile, summary, progress)
    notifier = views.error_notifier[0]
    notifier.fill(0)
    notifier["step"] = R.NOTIFIER_NO_STEP
    payload_sha = bytes(32)

    def fail(outcome: int, info32: int, submission: int, step: int | None, reason: str):
        if summary.outcome not in (R.OUTCOME_COMPLETED, R.OUTCOME_INTERRUPTED):
            return                          # the first failure is the one the notifier keeps
        summary.outcome = outcome
        summary.error = reason
        notifier["time_ns"] = time.clock_gettime_ns(time.CLOCK_REALTIME)
        notifier["info32"] = info32
        notifier["info16"] = submission
        notifier["status"] = R.NOTIFIER_STATUS_ERROR
        notifier["sequence"] = ring.gp_put
        notifier["step"] = R.NOTIFIER_NO_STEP if step is None else step
        notifier["reason"] = reason.encode("ascii", "replace")[:40]

    context = c0
    fwd_off, fin_off = L.record_forward_offset(profile), L.record_final_offset(profile)
    switch = sys.getswitchinterval()
    # a publisher thread must not hold the GIL for 5 ms while the loop waits on a ~1 ms fence
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with _Signals(progress) as signals:
        try:
            # ---- parameters onto the device ----
            if inp.fresh:
                _upload_fresh(backend, profile)
            else:
                loaded = inp.load_chunks(lambda off, view: backend.upload_chunk(off, len(view)),
                                         transfer=views.transfer)
                payload_sha = loaded.payload_sha256
            backend.instantiate(t_base=c0 - 1)
            floor = None
            if req.tokens is None:
                from staging import synthetic
                floor = synthetic.loss_floor(profile)
            progress.start(summary, floor, profile.context)
            # ---- forward submission: record forward part and predictions on context c0 ----
            cache.write_input_record(views, context)
            views.write_marker(fwd_off)
            ring.run(L.SUBMISSION_FORWARD, context, None)
            if views.marker_survived(fwd_off):
                raise _MarkerSurvived("forward")
            writer.write_forward(views.bytes_at(fwd_off, L.record_forward_bytes(profile)))
            # ---- one update issue per step ----
            loss_record = views.f32(L.LOSS_RECORD, L.LOSS_RECORD_BYTES // 4)   # (T,) ce rows
            for s in range(steps):
                if signals.received:
                    break
                context = c0 + s
                cache.write_input_record(views, context)
                ring.run(L.SUBMISSION_UPDATE, context, s)
                writer.append_step(views.bytes_at(L.LOSS_RECORD, L.LOSS_RECORD_BYTES))
                summary.steps_completed = s + 1
                summary.update_count = c0 + s + 1
                loss = float(loss_record.mean(dtype=np.float64))
                summary.losses.append(loss)
                progress.step(s, loss)
                if (s + 1 == steps or (s + 1) % profile.checkpoint_interval == 0
                        or signals.received):
                    publisher.start(summary.update_count)
            if signals.received and summary.steps_completed < steps:
                summary.outcome = R.OUTCOME_INTERRUPTED
                summary.error = f"interrupted by {signal.Signals(signals.received).name}"
                if publisher.update_count != summary.update_count and summary.steps_completed:
                    publisher.start(summary.update_count)
            # ---- final submission on the last step's context with the final parameters ----
            views.write_marker(fin_off)
            ring.run(L.SUBMISSION_FINAL, context, None)
            if views.marker_survived(fin_off):
                raise _MarkerSurvived("final")
        except _MarkerSurvived as e:
            fail(R.OUTCOME_DEVICE_ERROR, R.INFO_MARKER_SURVIVED, e.submission, None,
                 f"{L.SUBMISSIONS[e.submission]} record marker survived")
        except DeviceError as e:
            step = summary.steps_completed if summary.steps_completed < steps else None
            fail(R.OUTCOME_DEVICE_ERROR, e.code or 0xFFFF, _current_submission(ring), step, str(e))
        except (OSError, ckpt_mod.CheckpointWriteFailed) as e:
            fail(R.OUTCOME_HOST_ERROR, R.INFO_HOST_IO, _current_submission(ring), None,
                 f"host I/O: {getattr(e, 'strerror', None) or e}")
        finally:
            sys.setswitchinterval(switch)
        # the last publication must be complete (and its digest known) before the tail
        try:
            publisher.wait()
        except DeviceError as e:
            fail(R.OUTCOME_DEVICE_ERROR, e.code or 0xFFFF, _current_submission(ring), None,
                 f"publication: {e}")
        except (OSError, ckpt_mod.CheckpointWriteFailed) as e:
            fail(R.OUTCOME_HOST_ERROR, R.INFO_HOST_IO, _current_submission(ring), None,
                 f"host I/O: {getattr(e, 'strerror', None) or e}")
        if summary.outcome == R.OUTCOME_INTERRUPTED:
            notifier["time_ns"] = time.clock_gettime_ns(time.CLOCK_REALTIME)
            notifier["info16"] = L.SUBMISSION_UPDATE
            notifier["sequence"] = ring.gp_put
            notifier["step"] = summary.steps_completed
            notifier["reason"] = summary.error.encode("ascii", "replace")[:40]

    # ---- the tail ----
    if not writer.forward_written:      # the forward submission failed: keep what staging holds
        writer.write_forward(views.bytes_at(fwd_off, L.record_forward_bytes(profile)))
    summary.wall_s = time.monotonic() - t_start
    st = inp.restat()                   # the input as opened at the start, taken after the run
    stat = R.STAT_RECORD.pack(
        st_dev=st.st_dev, st_ino=st.st_ino, st_size=st.st_size, st_mode=st.st_mode,
        st_nlink=st.st_nlink, st_uid=st.st_uid, st_gid=st.st_gid, st_atime_ns=st.st_atime_ns,
        st_mtime_ns=st.st_mtime_ns, st_ctime_ns=st.st_ctime_ns, st_blocks=st.st_blocks,
        st_blksize=st.st_blksize, update_count=c0, gp_get=ring.gp_get, gp_put=ring.gp_put,
        semaphore_word=int(views.u32(L.SEMAPHORES, 1)[0]),
        payload_sha256=np.frombuffer(payload_sha, np.uint8))
    status = R.STATUS_BLOCK.pack(
        magic=R.STATUS_MAGIC, version=R.STATUS_VERSION, outcome=summary.outcome, c0=c0,
        steps_planned=steps, steps_completed=summary.steps_completed,
        update_count=summary.update_count, gp_get=ring.gp_get, gp_put=ring.gp_put,
        publications=summary.publications, backend=backend.code,
        wall_ns=int(summary.wall_s * 1e9), predictions=views.predictions.copy(),
        compute_capability=dev.compute_capability, driver_version=dev.driver_version,
        checkpoint_sha256=np.frombuffer(publisher.sha256, np.uint8),
        device_name=dev.name.encode("ascii", "replace")[:24])
    writer.write_tail(stat=stat,
                      loss_block=views.bytes_at(L.LOSS_BLOCK, L.LOSS_BLOCK_BYTES),
                      final_part=views.bytes_at(fin_off, L.record_final_bytes(profile)),
                      semaphores=views.bytes_at(L.SEMAPHORES, L.SEMAPHORE_REGION_BYTES),
                      error_notifier=views.bytes_at(L.ERROR_NOTIFIER, L.ERROR_NOTIFIER_BYTES),
                      status=status, timestamps=ring.entries().tobytes())
    progress.stop()
    return summary


class _MarkerSurvived(Exception):
    def __init__(self, name: str):
        self.submission = L.SUBMISSIONS.index(name)


def _current_submission(ring) -> int:
    if ring.gp_put == 0:
        return L.SUBMISSION_FORWARD
    return int(ring.table[ring.gp_put - 1]["submission"])
