"""Refusals at the run level: a refused or early-interrupted run writes nothing, every
spelling of a checkpoint takes one lock, a failed publication's notifier reason starts with its
cause, and the closing lines stay one line each at any width.

The runs use the cuda backend's host logic on the fake driver (tools/fake_driver.py, in-process,
milliseconds a run); its device runs only the releases, so the record-marker check is switched off
to let a run reach its update steps.
"""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from coppelius import checkpoints
from coppelius import cli
from coppelius.backends.cuda import ptx
from coppelius.run import loop as run_mod
from coppelius.run import records
from coppelius.plan import profiles
from coppelius.staging import records as R
from coppelius.staging import tokens as tk

from tests.support.fake_driver_fixture import install_for_runs
from tests.support.paths import ROOT

TINY = profiles.get("tiny")
REPO = ROOT

pytestmark = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


@pytest.fixture
def fake(monkeypatch):
    """The fake driver under the cuda backend; its records pass the marker check."""
    return install_for_runs(monkeypatch)


@pytest.fixture
def guard():
    """A SIGTERM that reaches no run handler is recorded here instead of killing pytest."""
    got = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    yield got
    signal.signal(signal.SIGTERM, old)


def cache(path: Path, contexts: int = TINY.steps + 2) -> Path:
    ids = np.random.default_rng(5).integers(0, TINY.vocab, TINY.context * contexts + 1,
                                            dtype="<u4")
    # a source's header: zeros would claim the embedded stream
    path.write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    return path


def checkpoint(path: Path, update_count: int = 0) -> Path:
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    checkpoints.publish(path, TINY, P * 1e-2, P * 0, P * 0 + 1e-6, update_count=update_count)
    return path


def run_argv(d: Path, ckpt, result, *extra) -> list[str]:
    return ["run", "--profile", "tiny", "--backend", "cuda", "--quiet", "--directory",
            str(d / "run"), "--tokens", str(d / "t.tokens"), "--checkpoint", str(ckpt),
            "--result", str(result), *extra]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------- nothing left behind

def test_a_refused_payload_leaves_no_result_and_the_corrected_rerun_succeeds(fake, tmp_path,
                                                                            capsys):
    cache(tmp_path / "t.tokens")
    good = checkpoint(tmp_path / "c.ckpt")
    saved = good.read_bytes()
    data = bytearray(saved)
    data[-1] ^= 0x10                                       # the last chunk's last byte
    good.write_bytes(bytes(data))
    result = tmp_path / "r.bin"
    assert cli.main(run_argv(tmp_path, good, result)) == 2
    assert "chunk 2 of 2 digest differs" in one_line(capsys)
    assert not result.exists()
    assert cli.main(["inspect", str(result)]) == 2
    assert f"result file {result} does not exist" in one_line(capsys)
    good.write_bytes(saved)                                 # the correction
    assert cli.main(run_argv(tmp_path, good, result)) == 0, capsys.readouterr().err
    from coppelius.results.reader import read
    rf = read(result)
    assert rf.outcome == "completed" and rf.steps == TINY.steps


def test_a_refused_overwrite_leaves_the_previous_file_as_it_was(fake, tmp_path, capsys):
    cache(tmp_path / "t.tokens")
    bad = checkpoint(tmp_path / "c.ckpt")
    data = bytearray(bad.read_bytes())
    data[-1] ^= 1
    bad.write_bytes(bytes(data))
    result = tmp_path / "r.bin"
    result.write_bytes(b"the previous result")
    assert cli.main(run_argv(tmp_path, bad, result, "--overwrite")) == 2
    assert "digest differs" in one_line(capsys)
    assert result.read_bytes() == b"the previous result"


def test_the_writer_removes_only_a_file_it_created(tmp_path):
    from coppelius.results.writer import ResultWriter
    w = ResultWriter.create(tmp_path / "new.bin", TINY)
    w.discard()
    assert not (tmp_path / "new.bin").exists()
    (tmp_path / "old.bin").write_bytes(b"old")
    w = ResultWriter.create(tmp_path / "old.bin", TINY, overwrite=True)
    w.discard()
    assert (tmp_path / "old.bin").read_bytes() == b"old"
    # created, then replaced by someone else: the other file stays
    w = ResultWriter.create(tmp_path / "raced.bin", TINY)
    os.replace(tmp_path / "old.bin", tmp_path / "raced.bin")
    w.discard()
    assert (tmp_path / "raced.bin").read_bytes() == b"old"


# ---------------------------------------------------------------------- one lock per file

def test_every_spelling_of_a_checkpoint_takes_the_same_lock(tmp_path):
    real = tmp_path / "real.ckpt"
    real.write_bytes(b"")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.ckpt"
    link.symlink_to(real)
    dotdot = tmp_path / "sub" / ".." / "real.ckpt"
    for first, second in ((real, link), (link, real), (real, dotdot), (dotdot, link)):
        with checkpoints.lock(first) as held:
            assert held == f"{real}.lock"
            with pytest.raises(checkpoints.CheckpointLocked, match="is in use by another run"):
                with checkpoints.lock(second):
                    pass


def test_a_run_through_a_symlink_is_refused_while_the_target_runs(fake, tmp_path, capsys):
    cache(tmp_path / "t.tokens")
    real = tmp_path / "real.ckpt"
    real.write_bytes(b"")
    link = tmp_path / "link.ckpt"
    link.symlink_to(real)
    with checkpoints.lock(real):
        for spelling in (link, tmp_path / "run" / ".." / "real.ckpt"):
            (tmp_path / "run").mkdir(exist_ok=True)
            assert cli.main(run_argv(tmp_path, spelling, tmp_path / "r.bin")) == 2
            line = one_line(capsys)
            assert f"checkpoint {spelling} is in use by another run: {real}.lock is locked" in line
            assert not (tmp_path / "r.bin").exists()


def test_a_run_through_a_symlink_publishes_to_its_target(fake, tmp_path, capsys):
    cache(tmp_path / "t.tokens")
    real = tmp_path / "real.ckpt"
    real.write_bytes(b"")
    link = tmp_path / "link.ckpt"
    link.symlink_to(real)
    assert cli.main(run_argv(tmp_path, link, tmp_path / "r.bin")) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert checkpoints.read_header(real)[0].update_count == TINY.steps


# ------------------------------------------------------------------------------ messages

def test_a_full_disk_names_its_cause_first_and_the_line_is_not_wrapped(fake, tmp_path, capsys,
                                                                      monkeypatch):
    def full(fd, buf, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr("coppelius.checkpoints.publication.pwrite_all", full)   # the payload writes
    cache(tmp_path / "t.tokens")
    ckpt = tmp_path / ("a-long-directory-name-" * 3) / "c.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"")
    result = tmp_path / "r.bin"
    assert cli.main(run_argv(tmp_path, ckpt, result)) == records.EXIT_HOST_ERROR
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "publication failed" in line)
    assert line.startswith(f"checkpoint {ckpt}: publication failed writing chunk 1 of 2: "
                           "No space left on device (ENOSPC) (the previous checkpoint is intact)")
    assert line.endswith("(hint: free space on the filesystem holding the checkpoint path)")
    assert len(line) > 160                          # wider than any terminal default, one line
    from coppelius.results.reader import read
    rf = read(result)
    assert rf.outcome_code == R.OUTCOME_HOST_ERROR
    assert bytes(rf.error_notifier["reason"]).rstrip(b"\0") == b"ENOSPC writing chunk 1 of 2"
    assert ckpt.stat().st_size == 0


def _signal_at(monkeypatch, target, name):
    """Wrap target.name so that it sends this process SIGTERM before doing its work."""
    real = getattr(target, name)

    def wrapped(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(target, name, wrapped)


def _after(monkeypatch, target, name):
    """Wrap target.name so that it sends SIGTERM after its work."""
    real = getattr(target, name)

    def wrapped(*a, **k):
        out = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return out
    monkeypatch.setattr(target, name, wrapped)


MOMENTS = {
    "while the frame starts": lambda m: _signal_at(m, cli, "build_parser"),
    "while the token cache is checked": lambda m: _signal_at(m, tk.TokenCache, "validate_run"),
    "while the backend starts": lambda m: _signal_at(m, run_mod, "make_backend"),
    "while the checkpoint loads": lambda m: _signal_at(m, checkpoints.InputCheckpoint, "load_chunks"),
    "during the forward submission": lambda m: _after(m, run_mod._Invocation, "forward"),
}


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigterm_before_the_first_step_writes_nothing_and_exits_interrupted(
        moment, fake, guard, tmp_path, capsys, monkeypatch):
    cache(tmp_path / "t.tokens")
    ckpt = checkpoint(tmp_path / "c.ckpt", update_count=1)
    before = digest(ckpt)
    MOMENTS[moment](monkeypatch)
    result = tmp_path / "r.bin"
    assert cli.main(run_argv(tmp_path, ckpt, result)) == records.EXIT_INTERRUPTED == 3
    assert not guard, "SIGTERM reached no run handler"
    err = capsys.readouterr().err
    lines = err.splitlines()
    if moment == "during the forward submission":       # the run had said it started
        assert lines[0].startswith("coppelius run: c0=1, 8 steps, checkpoint "), err
        lines = lines[1:]
    assert len(lines) == 1, err
    assert lines[0] == (f"coppelius run: interrupted by SIGTERM before the first step: nothing was "
                    f"written (no result file; checkpoint {ckpt} untouched) "
                    "(hint: run again to train)")
    assert not result.exists() and digest(ckpt) == before


def test_sigterm_after_the_first_step_publishes_and_writes_the_tail(fake, guard, tmp_path,
                                                                   capsys, monkeypatch):
    """The other side of the line: once a step is done, SIGTERM keeps what was learned."""
    from coppelius.cli import run as cmd_run
    from coppelius.results.reader import read

    class Interrupting(cmd_run.RichProgress):
        def step(self, step, loss):
            super().step(step, loss)
            if step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(cmd_run, "RichProgress", Interrupting)
    cache(tmp_path / "t.tokens")
    ckpt = tmp_path / "c.ckpt"
    ckpt.write_bytes(b"")
    assert cli.main(run_argv(tmp_path, ckpt, tmp_path / "r.bin")) == 3
    rf = read(tmp_path / "r.bin")
    assert rf.outcome_code == R.OUTCOME_INTERRUPTED and rf.steps == 2
    assert checkpoints.read_header(ckpt)[0].update_count == 2
    assert not guard


def test_a_real_sigterm_before_the_first_step_is_an_interruption(tmp_path):
    """A real process on the interpret backend, signalled as soon as it holds the lock (it is
    then checking the stream or importing Triton, seconds from its first step): it says so in
    one line, exits 3, and leaves no result file and the checkpoint as it was."""
    cache(tmp_path / "t.tokens")
    (tmp_path / "c.ckpt").write_bytes(b"")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = run_argv(tmp_path, tmp_path / "c.ckpt", tmp_path / "r.bin")
    argv[argv.index("cuda")] = "interpret"
    p = subprocess.Popen([sys.executable, "-m", "coppelius.cli", *argv], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "c.ckpt.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err
    assert "interrupted by SIGTERM before the first step" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.bin").exists() and (tmp_path / "c.ckpt").stat().st_size == 0


def test_a_signal_before_another_command_starts_ends_it(guard, monkeypatch, capsys):
    _signal_at(monkeypatch, cli, "build_parser")
    assert cli.main(["profiles"]) == 128 + signal.SIGTERM
    assert one_line(capsys) == "coppelius profiles: interrupted by SIGTERM before it started"
    assert not guard


def test_a_path_that_looks_like_markup_is_printed_as_it_is(fake, tmp_path, capsys):
    """rich would read "[bold]" in a path as a style and drop it from the start line."""
    cache(tmp_path / "t.tokens")
    odd = tmp_path / "[bold]x"                   # a style tag (a closing one would be a "/")
    odd.mkdir()
    ckpt = odd / "c.ckpt"
    ckpt.write_bytes(b"")
    assert cli.main(run_argv(tmp_path, ckpt, odd / "r.bin")) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    start = next(line for line in err.splitlines() if "c0=0" in line)
    assert f"checkpoint {ckpt}, result {odd / 'r.bin'}" in start, start
