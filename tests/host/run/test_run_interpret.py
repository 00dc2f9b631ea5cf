"""End to end from the command line: tiny profile, interpret backend, no GPU.

One module-scoped complete run is shared by several checks (the interpreter is slow on 2 cores):
the committed golden (tests/golden/, made by another process) must be bit-identical to it
(`coppelius diff`), and an interrupted run continued by a fresh process in another directory must
reproduce its loss windows and its final checkpoint byte for byte — a second run compared with the
first.  The two run as two different CPUs would (tests/support/cpu_environments.py): the complete
run as the oldest this machine can emulate (OpenBLAS's oldest kernel family, one thread, numpy's
SIMD dispatch off), the interrupted and continued ones as the newest (its newest family, four
threads): the golden holds on both, the matrix's two ends (the whole matrix:
tests/host/run/test_cpu_independence.py).  (Two complete runs side by side, diffed, are the device check's tiny phase, which
tests/tools/test_gpu_check.py runs dry: 149 s here were a third copy of the same run.)
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.staging import layout as L
from coppelius.staging import result_sections as RS
from tests.support import cpu_environments as cpu
from tests.support.paths import GOLDEN

TINY = profiles.get("tiny")
OLDEST, NEWEST = cpu.environ(cpu.oldest()), cpu.environ(cpu.newest())


def cli(*args, cwd=None, timeout=900, env=None):
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


def run_args(d: Path, *extra):
    return ["run", "--profile", "tiny", "--backend", "interpret", "--quiet",
            "--directory", d / "run", "--checkpoint", d / "tiny.ckpt", "--result", d / "result.bin",
            *extra]


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    d = tmp_path_factory.mktemp("complete")
    (d / "tiny.ckpt").write_bytes(b"")
    t = time.monotonic()
    r = cli(*run_args(d), env=OLDEST)
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"\ncomplete tiny interpret run: {wall:.1f} s")
    return d, wall


def test_complete_run_size_and_verify(complete):
    d, wall = complete
    size = (d / "result.bin").stat().st_size
    assert size == RS.result_file_bytes(TINY, TINY.steps, TINY.steps + 2)
    r = cli("verify", d / "result.bin", "--steps", "2", "--directory", d / "run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "verified" in r.stdout
    # the checkpoint holds the final update count
    r = cli("checkpoint", "verify", d / "tiny.ckpt", "--profile", "tiny")
    assert r.returncode == 0, r.stderr


def test_the_complete_run_reproduces_the_golden(complete):
    """tests/golden/tiny-result-c0.bin (tools/make_golden.py) bit for bit, time and environment
    fields apart: the interpret backend's regression golden, which the device check also holds a
    cuda tiny run against (`diff --across-backends`).  The run computed as the oldest CPU this
    machine emulates (the golden was made with none of that set)."""
    d, _ = complete
    golden = GOLDEN / "tiny-result-c0.bin"
    r = cli("diff", golden, d / "result.bin")
    assert r.returncode == 0, (r.stdout[-3000:] + "\nthe stream, kernels or launch lists changed: "
                               "if on purpose, regenerate with `.venv/bin/python -m "
                               "tools.make_golden` and commit tests/golden/")


def test_sigterm_then_continue_reproduces_the_overlap(complete, tmp_path):
    from coppelius.results.reader import read
    d, _ = complete
    ckpt = tmp_path / "tiny.ckpt"
    ckpt.write_bytes(b"")
    first = tmp_path / "first.bin"
    p = subprocess.Popen([sys.executable, "-m", "coppelius.cli", "run", "--profile", "tiny",
                          "--backend", "interpret", "--directory", tmp_path / "run",
                          "--checkpoint", ckpt, "--result", first],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=NEWEST)
    # wait until two step windows have reached the result file, then interrupt
    fwd = L.record_forward_bytes(TINY)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        if first.exists() and first.stat().st_size >= fwd + 2 * L.STEP_WINDOW_BYTES:
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=600)
    assert p.returncode not in (0, None), err[-2000:]
    rf = read(first)
    k = int(rf.status["steps_completed"])
    assert 2 <= k < TINY.steps
    assert int(rf.status["outcome"]) == 2          # interrupted
    assert int(rf.status["update_count"]) == k
    # a fresh process continues from the published checkpoint
    second = tmp_path / "second.bin"
    r = cli("run", "--profile", "tiny", "--backend", "interpret", "--quiet", "--directory",
            tmp_path / "run", "--checkpoint", ckpt, "--result", second, "--steps", TINY.steps - k,
            env=NEWEST)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = read(d / "result.bin")
    cont = read(second)
    assert int(cont.status["c0"]) == k
    a = np.asarray(ref.losses[k:TINY.steps]).view(np.uint32)
    b = np.asarray(cont.losses[:TINY.steps - k]).view(np.uint32)
    np.testing.assert_array_equal(a, b)
    assert np.array_equal(np.asarray(ref.losses[:k]).view(np.uint32),
                          np.asarray(rf.losses[:k]).view(np.uint32))
    assert (d / "tiny.ckpt").read_bytes()[16:24] == ckpt.read_bytes()[16:24]   # same update count
    assert (d / "tiny.ckpt").read_bytes() == ckpt.read_bytes()


# ---- refusals: one line, exit != 0, before any device work ----

def _one_line(r):
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert r.returncode != 0
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_refuses_missing_checkpoint(tmp_path):
    line = _one_line(cli(*run_args(tmp_path)))
    assert "tiny.ckpt" in line and ": >" in line


def test_refuses_locked_checkpoint(tmp_path):
    import fcntl
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    with open(str(tmp_path / "tiny.ckpt") + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = _one_line(cli(*run_args(tmp_path)))
    assert "lock" in line


def test_refuses_existing_result(tmp_path):
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    (tmp_path / "result.bin").write_bytes(b"x")
    line = _one_line(cli(*run_args(tmp_path)))
    assert "result.bin" in line and "--overwrite" in line
    assert (tmp_path / "result.bin").read_bytes() == b"x"


def test_refuses_bad_tokens(tmp_path):
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    bad = tmp_path / "bad.tokens"
    bad.write_bytes(bytes(16) + np.arange(100, dtype="<u4").tobytes())
    line = _one_line(cli(*run_args(tmp_path, "--tokens", bad)))
    assert "bad.tokens" in line
    assert not (tmp_path / "result.bin").exists()


def test_refuses_tiny_checkpoint_for_coppelius(complete, tmp_path):
    d, _ = complete
    line = _one_line(cli("run", "--profile", "coppelius", "--backend", "interpret",
                         "--checkpoint", d / "tiny.ckpt", "--result", tmp_path / "r.bin",
                         "--directory", tmp_path / "run", "--quiet"))
    assert "identity" in line or "differs" in line
    assert not (tmp_path / "r.bin").exists()


def test_refuses_cuda_without_gpu(tmp_path):
    try:
        from coppelius.driver.calls import Device
        Device().close()
        pytest.skip("a GPU is present")
    except Exception:
        pass
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    line = _one_line(cli("run", "--profile", "tiny", "--backend", "cuda", "--quiet",
                         "--directory", tmp_path / "run", "--checkpoint", tmp_path / "tiny.ckpt",
                         "--result", tmp_path / "result.bin"))
    assert "interpret" in line
    assert not (tmp_path / "result.bin").exists()


def test_a_failed_publication_is_a_host_error_with_the_tail_written(tmp_path, monkeypatch):
    """The publisher thread's error reaches the run loop: outcome host error (0x10003 in the
    notifier), the checkpoint path untouched, the result file complete."""
    from coppelius import checkpoints
    from coppelius.results.reader import read
    from coppelius.run.loop import Request, run
    from coppelius.staging import records as R

    def refuse(*args, **kwargs):
        raise checkpoints.CheckpointWriteFailed("checkpoint: no space left on device (ENOSPC)")

    monkeypatch.setattr(checkpoints, "publish_chunks", refuse)
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    summary = run(Request(profile=TINY, checkpoint=tmp_path / "tiny.ckpt",
                          result=tmp_path / "r.bin", backend="interpret",
                          directory=tmp_path / "run", steps=1))
    assert summary.outcome == R.OUTCOME_HOST_ERROR and summary.exit_code == 4
    rf = read(tmp_path / "r.bin")
    assert int(rf.status["outcome"]) == R.OUTCOME_HOST_ERROR
    assert int(rf.status["steps_completed"]) == 1 and int(rf.status["publications"]) == 0
    assert int(rf.error_notifier["info32"]) == R.INFO_HOST_IO
    assert b"no space left" in bytes(rf.error_notifier["reason"])
    assert (tmp_path / "tiny.ckpt").stat().st_size == 0
    assert int(rf.timestamps[-1]["submission"]) == 2     # the final submission still ran
