"""The run loop: one invocation = lock, validate, load or initialize, forward, N updates, final, tail.

CONTRACT §2 and §7–§9.  The host never computes model math here: it stages inputs, rings the
doorbell, waits on fences, appends each step's loss window to the result file, publishes checkpoints
through the transfer window, and writes the tail — on completion, device failure, host failure or
interruption.  What the tail's host records hold is host/run/records.py's.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coppelius.plan import profiles, reference
from coppelius.staging import layout as L
from coppelius.staging import paths
from coppelius.staging import records as R
from coppelius.staging import synthetic
from coppelius.staging.tokens import TokenCache, TokenCacheChanged

from coppelius import checkpoints as ckpt
from coppelius.run import digest_replay
from coppelius.run.preflight import (Created, RunRefused, check_inputs, checkpoint_path,
                                     create_defaults, default_stream, refuse_locked)
from coppelius.driver import calls as drv
from coppelius.errors import DeviceError
from coppelius.backends.cuda.backend import CudaBackend
from coppelius.staging.errors import UserError
from coppelius.levels import RunLevels
from coppelius.run.publisher import Publisher
from coppelius.results import digests as DG
from coppelius.results import telemetry_file
from coppelius.results.writer import ResultWriteError, ResultWriter
from coppelius.run.ring import DEFAULT_FENCE_TIMEOUT_S, Ring
from coppelius.run.records import (EXIT_INTERRUPTED, Failure, MarkerSurvived, Notifier, Summary,
                                   check_loss_record, failure_of, saved_report, stat_record,
                                   status_block, tail_sections)

SWITCH_INTERVAL_S = 2e-4    # GIL hand-over bound while a publisher thread runs beside the loop
PUBLISHER_JOIN_S = 60.0     # after an unexpected error: a 692 MB publication takes ~2 s on CI

class RunInterrupted(UserError):
    """SIGINT/SIGTERM before the first step completed: nothing learned, so nothing is written
    (no result file, the checkpoint untouched); exits as interrupted."""
    exit_code = EXIT_INTERRUPTED


@dataclass
class Request:
    profile: profiles.Profile
    tokens: Path | None = None          # None: the embedded default stream
    checkpoint: Path | None = None      # None: <directory>/<profile>.ckpt (created empty if missing)
    result: Path | None = None          # None: <directory>/<profile>-result-c<c0>.bin
    backend: str = "cuda"
    device: int = 0                     # --device: the GPU's ordinal among the visible ones
    source: Path | None = None          # the token cache's source file, if its header must match
    overwrite: bool = False
    fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S
    directory: Path = Path(synthetic.DEFAULT_DIRECTORY)
    steps: int | None = None            # only for tests: fewer steps than the profile's
    digests: Path | None = None         # per-launch digests of one update (host/run/digest_replay.py)
    digest_step: int = 0                # ... of this step (0-based, within this run)
    digest_perturb: object = None       # tests and tools only: digest_replay.replay's hook
    soak: int = 1                       # --soak K: the digested step replayed K times
    digest_perturb_repetition: int = 0  # tests only: the soak repetition digest_perturb runs in


class Progress:
    """Live progress hooks; the command line passes a rich implementation, tests pass this one."""

    def start(self, summary: Summary, levels: RunLevels | None, tokens_per_step: int) -> None: ...
    def step(self, step: int, loss: float) -> None: ...
    def published(self, update_count: int, seconds: float) -> None: ...
    def note(self, text: str) -> None: ...
    def stop(self) -> None: ...


class _Signals:
    """SIGINT/SIGTERM set a flag from the start of `run`; before training, `check` turns it into
    RunInterrupted (nothing written); during training the loop finishes the step in flight,
    publishes and stops."""

    def __init__(self, progress: Progress):
        self.received: int | None = None
        self.progress = progress
        self.training = False           # the update loop has started: a signal is noted
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
            # a signal that came while the process started (coppelius.cli.EarlySignals) counts
            if self.received is None and getattr(self._old[sig], "received", None):
                self.received = self._old[sig].received
        return self

    def _handle(self, signum, frame):
        if self.received is None and self.training:
            self.progress.note(f"{signal.Signals(signum).name}: finishing the step in flight, "
                               "then publishing")
        self.received = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def check(self, checkpoint) -> None:
        """Refuse to go on when a signal came before the first step."""
        if self.received:
            raise RunInterrupted(f"interrupted by {self.name} before the first step: nothing was "
                                 f"written (no result file; checkpoint {checkpoint} untouched)",
                                 "run again to train")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def make_backend(name: str, profile, device: int = 0):
    if name == "cuda":
        return CudaBackend(profile, ordinal=device)
    if device != 0:
        raise RunRefused(f"--device {device} names a GPU; the {name} backend runs on the CPU",
                         "leave --device out, or use --backend cuda")
    if name == "interpret":
        try:        # here, not at the top: it imports Triton and torch and sets TRITON_INTERPRET
            from coppelius.backends.interpret import InterpretBackend
        except ImportError as e:
            raise RunRefused(f"the interpret backend needs Triton and torch ({e})",
                             drv.install_hint("demo")) from None
        return InterpretBackend(profile)
    raise RunRefused(f"unknown backend {name!r}", "use --backend cuda or --backend interpret")


def run(req: Request, progress: Progress | None = None) -> Summary:
    """One invocation.  Every refusal (arguments, paths, lock, checkpoint envelope and payload,
    token cache, backend) comes before anything is created: the directory, the default
    checkpoint, the lock file and the embedded stream are made only once the backend is open.
    The payload's chunk digests are checked twice: in a first pass before anything is created
    (a damaged payload is refused with the directory as it was found), and again as the
    payload streams to the device (a file changed in between).  A refusal or an interruption
    before the first step removes what the run created (`Created`: the result file, the stream,
    the default checkpoint and directory; the lock file goes with the lock)."""
    progress = progress or Progress()
    profile = req.profile
    steps = profile.steps if req.steps is None else req.steps
    if not 0 < steps <= profile.steps:
        raise RunRefused(f"--steps {steps} is outside 1..{profile.steps}",
                         f"the {profile.name} profile runs 1 to {profile.steps} steps")
    if req.soak != 1 and (req.digests is None or req.soak < 1):
        raise RunRefused(f"--soak {req.soak} needs --digests FILE and K ≥ 1",
                         "e.g. --digests soak.json --soak 8")
    if req.digests is not None:
        digest_replay.check_request(req.digest_step, steps)
        paths.check_output(Path(req.digests), "digests file", overwrite=req.overwrite,
                           cls=RunRefused,
                           exists_hint="pass --overwrite, or name another --digests FILE",
                           recognize=paths.recognize_json(DG.FORMAT),
                           foreign_hint="name another --digests FILE", flag="--overwrite")
    with _Signals(progress) as signals:
        ckpt_path, create = checkpoint_path(req)
        c0 = 0
        if not create:
            with ckpt.open_input(ckpt_path, profile) as probe:   # refuse a bad path before locking
                c0 = probe.update_count
                if not probe.fresh:     # every chunk digest now, before anything is created
                    probe.load_chunks(lambda offset, view: None)
            refuse_locked(ckpt_path)
        cache, _ = check_inputs(req, steps, c0)
        if cache is not None:
            cache.close()
        signals.check(ckpt_path)
        backend = make_backend(req.backend, profile, req.device)
        created, writers = Created(), []
        try:
            with backend:
                signals.check(ckpt_path)
                create_defaults(req, ckpt_path, create, created)
                # one file under every spelling (a symbolic link, dir/../): lock, read and
                # publish the resolved path, so that two runs on one checkpoint always contend
                # for one lock (the lock file is the lock's: it goes when the run ends)
                resolved = Path(os.path.realpath(ckpt_path))
                with ckpt.lock(resolved, name=ckpt_path), \
                        ckpt.open_input(resolved, profile, name=ckpt_path) as inp:
                    stream = default_stream(req)
                    fresh_stream = stream is not None and not os.path.lexists(stream)
                    cache, result_path = check_inputs(req, steps, inp.update_count,
                                                      generate=True)
                    if fresh_stream:
                        created.add(stream, Created.FILE)
                    opened = Opened(steps=steps, inp=inp, cache=cache, checkpoint=ckpt_path,
                                    result=result_path, publish_to=resolved)
                    signals.check(ckpt_path)
                    # __exit__ on a refusal removes the file if this run created it and wrote
                    # nothing; steps: room for the tail is reserved, so that a full disk still
                    # leaves one
                    with ResultWriter.create(result_path, profile, overwrite=req.overwrite,
                                             steps=steps) as writer:
                        writers.append(writer)
                        return _Invocation(req, opened, backend, writer, progress,
                                           signals).run()
        except UserError:
            # refused (a damaged checkpoint payload is found while it streams to the device)
            # or interrupted before the first step: what this run created goes with it
            if not any(w.bytes_written for w in writers):
                created.undo()
            raise


# what ends a run with its tail written; anything else (a host bug) propagates without one
_FAILURES = (MarkerSurvived, DeviceError, OSError, ckpt.CheckpointWriteFailed, TokenCacheChanged)


@dataclass
class Opened:
    """What `run` opened and checked before a backend exists."""
    steps: int
    inp: ckpt.InputCheckpoint
    cache: TokenCache
    checkpoint: Path            # as the user named it (messages, the summary)
    result: Path
    publish_to: Path            # the resolved checkpoint path: locked, read, published


@contextlib.contextmanager
def _switch_interval(seconds: float):
    # a publisher thread must not hold the GIL for 5 ms while the loop waits on a ~1 ms fence
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _upload_fresh(backend, profile) -> None:
    """Fresh initialization (CONTRACT §4) through the transfer window: P drawn, M = V = 0."""
    P = reference.init_parameters(profile)                          # (N,) fp32
    backend.upload_payload(P.view(np.uint8))                        # zeros after P


class _Invocation:
    """One run on an open backend, in protocol order: parameters onto the device, forward,
    one update issue per step (publishing every interval), final, then the tail."""

    def __init__(self, req: Request, opened: Opened, backend, writer, progress: Progress,
                 signals: _Signals):
        self.req, self.profile, self.steps = req, req.profile, opened.steps
        self.opened, self.backend, self.writer, self.progress = opened, backend, writer, progress
        self.signals = signals
        self.views = backend.staging
        self.c0 = opened.inp.update_count
        self.summary = Summary(c0=self.c0, steps_planned=self.steps, update_count=self.c0,
                               result=opened.result, checkpoint=opened.checkpoint)
        self.ring = Ring(backend, capacity=self.steps + 2, timeout_s=req.fence_timeout_s)
        # the GPU's telemetry beside the result file (never a failure; none on the interpreter)
        self.telemetry = telemetry_file.Recorder(opened.result, backend.gpu_identity(), self.c0,
                                                 progress.note)
        self.publisher = Publisher(backend, opened.publish_to, self.profile, self.summary, progress,
                                   on_published=lambda n: self.telemetry.sample("publication", n))
        self.notifier = Notifier(self.views.error_notifier[0], self.ring)
        self.payload_sha256 = bytes(32)     # of the loaded checkpoint's payload; zeros when fresh
        self.forward_part: np.ndarray | None = None   # (3, V) f32, written with the first step
        self.forward_offset = L.record_forward_offset(self.profile)
        self.final_offset = L.record_final_offset(self.profile)
        self.digests = None if req.digests is None else digest_replay.StepDigests(
            backend, req.digest_step, Path(req.digests), self.c0, req.digest_perturb,
            req.soak, req.digest_perturb_repetition)

    def run(self) -> Summary:
        try:
            return self._run()
        except BaseException:
            self.progress.stop()        # a refusal's one line must not land inside a live bar
            raise
        finally:
            # an unexpected error must not leave a thread streaming through staging as it goes
            if not self.publisher.join(PUBLISHER_JOIN_S):
                self.backend.abandon("a publisher thread still streams through the staging region")

    def _run(self) -> Summary:
        try:
            return self._run_sampled()
        except BaseException:
            if not self.writer.bytes_written:   # its result file goes (ResultWriter.__exit__)
                self.telemetry.discard()
            raise
        finally:
            self.telemetry.close()

    def _run_sampled(self) -> Summary:
        self.telemetry.sample("start", self.c0)     # outside the run's wall time, as "end" is
        t_start = time.monotonic()
        summary, signals = self.summary, self.signals
        try:
            with _switch_interval(SWITCH_INTERVAL_S):
                self.load_parameters()
                self.backend.instantiate(t_base=self.c0 - 1)
                signals.check(self.opened.checkpoint)
                levels = (RunLevels.of_run(self.profile, self.c0, self.steps)
                          if self.req.tokens is None else None)     # the embedded stream's floors
                self.progress.start(summary, levels, self.profile.context)
                self.forward()
                context = self.updates()
                self.final(context)
        except _FAILURES as e:
            step = summary.steps_completed if summary.steps_completed < self.steps else None
            self.record_failure(failure_of(e, self.ring, step))
        # the last publication must be complete (and its digest known) before the tail
        try:
            self.publisher.wait()
        except _FAILURES as e:
            self.record_failure(failure_of(e, self.ring, None, during="publication: "))
        if summary.outcome == R.OUTCOME_INTERRUPTED:
            self.notifier.fill(info32=0, submission=L.SUBMISSION_UPDATE,
                               step=summary.steps_completed, reason=summary.error,
                               status=R.NOTIFIER_STATUS_NONE)
        summary.wall_s = time.monotonic() - t_start
        self.telemetry.sample("end", summary.update_count)
        self.finish_file()
        self.progress.stop()
        return summary

    def load_parameters(self) -> None:
        inp = self.opened.inp
        if inp.fresh:
            _upload_fresh(self.backend, self.profile)
            return
        loaded = inp.load_chunks(lambda off, view: self.backend.upload_chunk(off, len(view)),
                                 transfer=self.views.transfer)
        self.payload_sha256 = loaded.payload_sha256

    def forward(self) -> None:
        """Forward submission: the record's forward part and predictions on context c0.  The part
        reaches the file with the first step window, so that a run interrupted before its first
        step writes nothing."""
        self.opened.cache.write_input_record(self.views, self.c0)
        self.views.write_marker(self.forward_offset)
        self.ring.run(L.SUBMISSION_FORWARD, self.c0, None)
        if self.views.marker_survived(self.forward_offset):
            raise MarkerSurvived("forward")
        self.forward_part = np.array(self.views.record_forward, copy=True)

    def updates(self) -> int:
        """One update issue per step until done or signalled; returns the last step's context."""
        summary, c0, steps, signals = self.summary, self.c0, self.steps, self.signals
        context = c0
        signals.training = True
        for s in range(steps):
            if s == 0:
                signals.check(self.opened.checkpoint)
            elif signals.received:
                break
            context = c0 + s
            self.opened.cache.write_input_record(self.views, context)
            if self.digests is not None:
                self.digests.before(s)
            self.ring.run(L.SUBMISSION_UPDATE, context, s)
            # before the window reaches the file: a marked row ends the run, this step unsaved
            check_loss_record(self.views.loss_record, s, context, self.profile.vocab)
            if s == 0:
                self.writer.write_forward(self.forward_part)
            self.writer.append_step(self.views.loss_record)
            summary.steps_completed = s + 1
            summary.update_count = c0 + s + 1
            loss = float(self.views.loss_record.mean(dtype=np.float64))   # (T,) ce rows
            summary.losses.append(loss)
            self.progress.step(s, loss)
            if self.digests is not None:           # after the step's row left staging
                self.digests.after(s, context, self.ring.issues)
            if (s + 1 == steps or (s + 1) % self.profile.checkpoint_interval == 0
                    or signals.received):
                self.publisher.start(summary.update_count)
        if signals.received and summary.steps_completed < steps:
            summary.outcome = R.OUTCOME_INTERRUPTED
            summary.error = f"interrupted by {signals.name}"
            if self.publisher.update_count != summary.update_count and summary.steps_completed:
                self.publisher.start(summary.update_count)
        return context

    def final(self, context: int) -> None:
        """Final submission on the last step's context with the final parameters."""
        self.views.write_marker(self.final_offset)
        self.ring.run(L.SUBMISSION_FINAL, context, None)
        if self.views.marker_survived(self.final_offset):
            raise MarkerSurvived("final")

    def record_failure(self, failure: Failure) -> None:
        """The first failure is the one the summary and the notifier keep (an interruption
        before it is overridden)."""
        if self.summary.outcome not in (R.OUTCOME_COMPLETED, R.OUTCOME_INTERRUPTED):
            return
        self.summary.outcome, self.summary.error = failure.outcome, failure.message
        self.notifier.fill(info32=failure.info32, submission=failure.submission,
                           step=failure.step, reason=failure.reason,
                           status=R.NOTIFIER_STATUS_ERROR)

    def finish_file(self) -> None:
        """The forward part if no step window carried it, the tail, fsync: a failure here is a
        host error too (CONTRACT §2), and a host error's summary ends with what was saved."""
        writer = self.writer
        try:
            if not writer.forward_written:  # no step window reached the file: write it now
                writer.write_forward(self.views.record_forward if self.forward_part is None
                                     else self.forward_part)
            self.write_tail()
            writer.close()
        except ResultWriteError as e:
            self.record_failure(failure_of(e, self.ring, None))
        if self.summary.outcome != R.OUTCOME_HOST_ERROR:
            return
        if writer.tail_written:
            kept = (f"{writer.steps_written} step windows and the tail "
                    "(`coppelius inspect` reads it)")
        elif writer.failed is not None and writer.failed.errno == errno.ENOENT:
            kept = "removed or replaced during the run: nothing of this run is there"
        else:
            kept = (f"{writer.steps_written} step windows, no tail (no room for it: "
                    "`coppelius inspect` refuses it)")
        self.summary.error += "\n" + saved_report(self.summary, self.publisher.published, kept)

    def write_tail(self) -> None:
        stat = stat_record(self.opened.inp, self.ring, self.views, self.payload_sha256)
        status = status_block(self.summary, self.ring, self.backend, self.views,
                               self.publisher.sha256)
        self.writer.write_tail(**tail_sections(self.views, stat, status, self.ring.entries()))
