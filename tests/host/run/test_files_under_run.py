"""Files that change under a running run, through the cuda backend's own path on the
fake driver (it runs only the releases, so a step costs nothing; the record markers are passed as
the device would leave them) and, for the two file scenarios that matter most, on the interpret
backend: a token cache truncated or overwritten mid-run, a result file whose disk fills, whose
write fails with EIO/EDQUOT/EFBIG, or that is removed or replaced — each ends as a host error
(exit 4) with the notifier naming file and errno, the checkpoint holding the last completed
publication, and, where the file is still there, a tail `inspect` reads."""
from __future__ import annotations

import errno
import os
import subprocess

import numpy as np
import pytest

from coppelius.backends.cuda import ptx
from coppelius.plan import profiles
from coppelius.results import writer as W
from coppelius.results.reader import read
from coppelius.staging import records as R
from coppelius.staging import tokens as tk
from coppelius.staging.views import StagingViews

from tests.support.fake_driver_fixture import fake  # noqa: F401  (the fixture)

TINY = profiles.get("tiny")
T, V = TINY.context, TINY.vocab
INTERVAL = TINY.checkpoint_interval
needs_ptx = pytest.mark.skipif(not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(),
                               reason="kernels_ptx not built")


class At:
    """Progress that calls `act()` once, when step `at` has completed (its window is in the
    result file; the publication at an interval starts right after), or with at="start" before
    the forward submission."""

    def __init__(self, at, act):
        self.at, self.act = at, act

    def start(self, *a):
        if self.at == "start":
            self.act()

    def published(self, *a): ...
    def note(self, *a): ...
    def stop(self): ...

    def step(self, step, loss):
        if step == self.at:
            self.act()


def cache_file(path, contexts=TINY.steps + 1):
    ids = np.random.default_rng(7).integers(0, V, contexts * T + 1, dtype=np.uint32)
    # a source's header: zeros would claim the embedded stream
    path.write_bytes(tk.header_bytes(1, 1) + ids.astype("<u4").tobytes())
    return path


def run_fake(tmp_path, monkeypatch, progress, steps=TINY.steps, backend="cuda"):
    from coppelius.run.loop import Request, run
    if backend == "cuda":
        monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    (tmp_path / "c.ckpt").write_bytes(b"")
    return run(Request(profile=TINY, tokens=tmp_path / "t.tokens", checkpoint=tmp_path / "c.ckpt",
                       result=tmp_path / "r.bin", backend=backend, directory=tmp_path / "run",
                       steps=steps, fence_timeout_s=30), progress)


def published_count(tmp_path) -> int:
    data = (tmp_path / "c.ckpt").read_bytes()
    return int.from_bytes(data[16:24], "little") if data else 0


def host_error(summary, tmp_path, reason: bytes, tail=True):
    assert summary.outcome == R.OUTCOME_HOST_ERROR and summary.exit_code == 4, summary.error
    assert "saved: checkpoint" in summary.error and "not saved:" in summary.error
    if not tail:
        return None
    rf = read(tmp_path / "r.bin")
    assert int(rf.status["outcome"]) == R.OUTCOME_HOST_ERROR
    n = rf.error_notifier
    assert int(n["info32"]) == R.INFO_HOST_IO and int(n["status"]) == R.NOTIFIER_STATUS_ERROR
    assert bytes(n["reason"]).startswith(reason), bytes(n["reason"])
    return rf


# ------------------------------------------------------------------ the token cache, fake driver

@needs_ptx
def test_a_cache_truncated_mid_run_ends_as_a_host_error_with_its_tail(fake, tmp_path,
                                                                       monkeypatch):
    fake()
    cache = cache_file(tmp_path / "t.tokens")
    summary = run_fake(tmp_path, monkeypatch, At(INTERVAL, lambda: os.truncate(cache, 100)))
    rf = host_error(summary, tmp_path, b"token cache changed: context %d" % (INTERVAL + 1))
    assert str(cache) in summary.error and f"context {INTERVAL + 1}" in summary.error
    assert int(rf.status["steps_completed"]) == INTERVAL + 1
    assert published_count(tmp_path) == INTERVAL         # the last completed publication
    assert f"update count {INTERVAL} (its last completed publication)" in summary.error
    assert f"updates {INTERVAL + 1}..{INTERVAL + 1} (trained, not published" in summary.error


@needs_ptx
def test_ids_overwritten_mid_run_are_refused_before_any_publication_of_them(fake, tmp_path,
                                                                           monkeypatch):
    """The issue's reproducer: every id after the first context set to 0xFFFFFFFF in place, the
    mtime put back, so that only the id check can see it."""
    fake()
    cache = cache_file(tmp_path / "t.tokens")

    def overwrite():
        st = cache.stat()
        with open(cache, "r+b") as f:
            f.seek(tk.HEADER_BYTES + 4 * T)
            f.write(b"\xff" * (st.st_size - tk.HEADER_BYTES - 4 * T))
        os.utime(cache, ns=(st.st_atime_ns, st.st_mtime_ns))

    summary = run_fake(tmp_path, monkeypatch, At(0, overwrite))
    rf = host_error(summary, tmp_path, b"token cache changed: context 1")
    assert "has id 4294967295, not below the vocabulary size 512" in summary.error
    assert int(rf.status["steps_completed"]) == 1 and int(rf.status["publications"]) == 0
    assert (tmp_path / "c.ckpt").stat().st_size == 0     # nothing published, nothing changed


# ------------------------------------------------------- an id ≥ V past the host's check, on the device

def marked_on_device(summary, tmp_path, step, row):
    """A device error (exit 1) naming the step and the row, the notifier's code the token id's,
    the step's window not in the file and nothing of it published."""
    assert summary.outcome == R.OUTCOME_DEVICE_ERROR and summary.exit_code == 1, summary.error
    assert f"step {step}" in summary.error and f"at row {row}" in summary.error
    assert f"outside [0, {V})" in summary.error and "coppelius run" in summary.error
    rf = read(tmp_path / "r.bin")
    n = rf.error_notifier
    assert int(n["info32"]) == R.INFO_TOKEN_ID and int(n["step"]) == step
    assert bytes(n["reason"]).rstrip(b"\0") == b"token id >= V: step %d row %d" % (step, row)
    assert int(rf.status["steps_completed"]) == step
    return rf


@needs_ptx
def test_a_row_the_device_marks_ends_the_run_as_a_device_error_naming_step_and_row(
        fake, tmp_path, monkeypatch):
    """The cuda host's path: the fake driver runs no kernel, so the test marks the loss record
    as cross_entropy would after update `step`; the run stops there, before the step's window,
    with the publication of the interval before it complete."""
    from coppelius.run.ring import Ring
    from coppelius.staging import layout as L
    fake()
    cache_file(tmp_path / "t.tokens")
    step, row, issue = INTERVAL + 1, 17, Ring.run

    def run_and_mark(self, submission, context, s):
        issue(self, submission, context, s)
        if submission == L.SUBMISSION_UPDATE and s == step:
            self.backend.staging.loss_record[row] = L.LOSS_BAD_ID

    monkeypatch.setattr(Ring, "run", run_and_mark)
    summary = run_fake(tmp_path, monkeypatch, At(None, lambda: None))
    marked_on_device(summary, tmp_path, step, row)
    assert published_count(tmp_path) == INTERVAL         # the interval's, from valid ids


@needs_ptx
def test_interpret_an_id_past_the_host_check_is_flagged_by_the_kernels(tmp_path, monkeypatch):
    """A test-only hook writes 0xFFFFFFFF into a staged input after the host's check of context
    0 (the forward's and step 0's): embed_fwd gathers nothing for it and cross_entropy marks its
    row, which the host names (one step: the interpreter's ~40 s a step on CI)."""
    pytest.importorskip("triton")
    cache_file(tmp_path / "t.tokens", contexts=2)
    row, check_and_stage = 5, tk.TokenCache.write_input_record

    def staged_then_poisoned(self, views, c):
        check_and_stage(self, views, c)
        views.inputs[row] = 0xFFFFFFFF

    monkeypatch.setattr(tk.TokenCache, "write_input_record", staged_then_poisoned)
    summary = run_fake(tmp_path, monkeypatch, At(None, lambda: None), steps=1,
                       backend="interpret")
    marked_on_device(summary, tmp_path, 0, row)
    assert (tmp_path / "c.ckpt").stat().st_size == 0


# ------------------------------------------------------------------ the result file, fake driver

def _fail_result_writes(monkeypatch, tmp_path, code, at_offset):
    """os.pwrite fails once with `code` for the result file at `at_offset` and beyond."""
    real, failed = os.pwrite, []
    target = str(tmp_path / "r.bin")

    def pwrite(fd, data, offset):
        if (not failed and offset >= at_offset
                and os.readlink(f"/proc/self/fd/{fd}") == target):
            failed.append(offset)
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", pwrite)
    return failed


@needs_ptx
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG])
def test_a_failed_step_write_is_a_host_error_naming_file_and_errno(fake, tmp_path, monkeypatch,
                                                                  code):
    fake()
    cache_file(tmp_path / "t.tokens")
    fwd = W.FORWARD.nbytes(TINY, 0, 0)
    step = INTERVAL + 1                                  # after the first publication started
    failed = _fail_result_writes(monkeypatch, tmp_path, code, fwd + step * 4096)
    summary = run_fake(tmp_path, monkeypatch, At(-1, None))
    name = errno.errorcode[code]
    rf = host_error(summary, tmp_path, f"{name} result file step {step}".encode())
    assert failed == [fwd + step * 4096]
    assert str(tmp_path / "r.bin") in summary.error and f"({name})" in summary.error
    assert int(rf.status["steps_completed"]) == step     # the failed step's window is not there
    assert published_count(tmp_path) == INTERVAL
    assert f"{step} step windows and the tail" in summary.error


@needs_ptx
@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_result_file_removed_or_replaced_mid_run_is_caught_before_the_tail(fake, tmp_path,
                                                                             monkeypatch, how):
    fake()
    cache_file(tmp_path / "t.tokens")
    result = tmp_path / "r.bin"

    def act():
        if how == "removed":
            result.unlink()
        else:
            (tmp_path / "other").write_bytes(b"someone else's")
            os.replace(tmp_path / "other", result)

    summary = run_fake(tmp_path, monkeypatch, At(1, act))
    host_error(summary, tmp_path, b"", tail=False)
    assert f"result file {result} was {how}" in summary.error and "(ENOENT)" in summary.error
    assert "before the tail" in summary.error and "nothing of this run is there" in summary.error
    if how == "replaced":
        assert result.read_bytes() == b"someone else's"     # never written to
    else:
        assert not result.exists()
    # the training went on (only the tail found the file gone): the checkpoint holds all of it
    assert published_count(tmp_path) == TINY.steps and summary.steps_completed == TINY.steps
    assert "not saved: nothing" in summary.error


@needs_ptx
def test_the_command_prints_what_was_saved_and_exits_4(fake, tmp_path, monkeypatch, capsys):
    from coppelius import cli
    fake()
    monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    cache_file(tmp_path / "t.tokens")
    (tmp_path / "c.ckpt").write_bytes(b"")
    fwd = W.FORWARD.nbytes(TINY, 0, 0)
    _fail_result_writes(monkeypatch, tmp_path, errno.ENOSPC, fwd + 6 * 4096)
    rc = cli.main(["run", "--profile", "tiny", "--backend", "cuda", "--quiet",
                   "--tokens", str(tmp_path / "t.tokens"), "--checkpoint", str(tmp_path / "c.ckpt"),
                   "--result", str(tmp_path / "r.bin"), "--directory", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "No space left on device (ENOSPC)" in err and "Traceback" not in err
    assert f"saved: checkpoint {tmp_path / 'c.ckpt'} at update count {INTERVAL}" in err
    assert "6 step windows and the tail" in err and "not saved: updates 5..6" in err
    assert cli.main(["inspect", str(tmp_path / "r.bin")]) == 0
    assert "host error" in capsys.readouterr().out


def test_no_room_for_the_reserve_is_a_refusal_before_anything_is_written(tmp_path, monkeypatch):
    def full(fd, mode, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(W, "_fallocate", full)
    with pytest.raises(W.ResultRefused, match=r"cannot reserve \d+ bytes for its tail: No space"):
        W.ResultWriter.create(tmp_path / "r.bin", TINY, steps=TINY.steps)
    assert not (tmp_path / "r.bin").exists()


def test_the_reserve_is_held_past_the_steps_and_given_back_at_close(tmp_path):
    """Reserved blocks show in st_blocks while the run writes and are gone once it closes; an
    overwritten file keeps its old bytes until the first write (the reserve never punches them)."""
    from tests.support.result_synth import synthesize
    syn = synthesize(TINY, steps=2)
    path = tmp_path / "r.bin"
    w = W.ResultWriter.create(path, TINY, steps=2)
    if w.reserve is None or not w.reserve.held:
        pytest.skip("this file system has no fallocate")
    assert path.stat().st_size == 0 and path.stat().st_blocks * 512 >= w.reserve.length
    w.write_forward(syn.forward)
    for window in syn.windows:
        w.append_step(window)
    w.write_tail(syn.stat, syn.loss_block, syn.final, syn.semaphores, syn.error_notifier,
                 syn.status, syn.timestamps)
    w.close()
    size = path.stat().st_size
    assert size == W.RS.result_file_bytes(TINY, 2, 4) and read(path).steps == 2
    assert path.stat().st_blocks * 512 < size + 2 * W.RESERVE_SLACK
    old = bytes(range(256)) * 400                       # larger than the reserve's offset
    path.write_bytes(old)
    W.ResultWriter.create(path, TINY, overwrite=True, steps=2).discard()
    assert path.read_bytes() == old


# ------------------------------------------------------------------ the interpret backend

def test_interpret_a_cache_truncated_mid_run_is_a_host_error_not_sigbus(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    cache = cache_file(tmp_path / "t.tokens", contexts=3)
    summary = run_fake(tmp_path, monkeypatch, At(0, lambda: os.truncate(cache, 4096)), steps=2,
                       backend="interpret")
    rf = host_error(summary, tmp_path, b"token cache changed: context 1")
    assert int(rf.status["steps_completed"]) == 1 and "size" in summary.error
    assert (tmp_path / "c.ckpt").stat().st_size == 0


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs, so that a filler file can fill it mid-run."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the fake-driver ENOSPC test covers the "
                    "path without one")
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory):
    """Write a filler until the file system is full (unbuffered: nothing left to flush)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_interpret_a_full_result_disk_is_a_host_error_with_a_readable_file(small_tmpfs,
                                                                           tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from coppelius.run.loop import Request, run
    cache_file(tmp_path / "t.tokens", contexts=2)
    (tmp_path / "c.ckpt").write_bytes(b"")
    result = small_tmpfs / "r.bin"
    # full before the forward submission: step 0's window (with the forward part) fails
    summary = run(Request(profile=TINY, tokens=tmp_path / "t.tokens",
                          checkpoint=tmp_path / "c.ckpt", result=result, backend="interpret",
                          directory=tmp_path / "run", steps=1),
                  At("start", lambda: _fill(small_tmpfs)))
    assert summary.exit_code == 4, summary.error
    assert "No space left on device (ENOSPC)" in summary.error and str(result) in summary.error
    rf = read(result)                                    # the tail fit in the reserve
    assert int(rf.status["outcome"]) == R.OUTCOME_HOST_ERROR
    assert int(rf.status["steps_completed"]) == 0 and int(rf.status["gp_put"]) == 2
    assert bytes(rf.error_notifier["reason"]).startswith(b"ENOSPC result file forward part")
    assert "0 step windows and the tail" in summary.error
    assert "not saved: updates 1..1" not in summary.error      # the step never counted


# ------------------------------------------------------------------ the lock, read-only

@pytest.mark.parametrize("exists", [True, False])
def test_a_read_only_lock_refusal_says_open_when_the_lock_file_exists(tmp_path, monkeypatch,
                                                                      exists):
    from coppelius import checkpoints as ckpt
    path = tmp_path / "c.ckpt"
    path.write_bytes(b"")
    lock_path = str(path) + ckpt.LOCK_SUFFIX
    if exists:
        open(lock_path, "w").close()
    real_open = os.open

    def read_only(p, flags, *a):
        if os.fspath(p) == lock_path:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), lock_path)
        return real_open(p, flags, *a)
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ckpt.CheckpointLocked) as e:
        with ckpt.lock(path):
            pass
    action = "open for writing" if exists else "create"
    assert f"lock file {lock_path}: cannot {action}: Read-only file system (EROFS)" in str(e.value)
    assert "writable" in e.value.hint


def test_the_lock_on_a_real_read_only_mount(small_tmpfs):
    from coppelius import checkpoints as ckpt
    path = small_tmpfs / "c.ckpt"
    path.write_bytes(b"")
    open(str(path) + ckpt.LOCK_SUFFIX, "w").close()
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
    with pytest.raises(ckpt.CheckpointLocked, match=r"cannot open for writing: Read-only file "
                                                     r"system \(EROFS\)"):
        with ckpt.lock(path):
            pass
