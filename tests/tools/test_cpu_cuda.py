"""A cuda run computed on the CPU equals the interpret backend's, byte for byte: the tiny profile,
one step fresh (its update digested launch by launch, `--digests`) and one step continued from
its checkpoint, on three paths —
  * interpret: `coppelius run --backend interpret`;
  * fake: `python -m tools.cpu_cuda run --backend cuda` (the executing tools/fake_driver.py);
  * stub: `coppelius run --backend cuda` through the real cuda-bindings and the C stub
    libcuda.so.1, the executor attached (tests/support/stub_execute/) —
and then `coppelius node` on the stub's GPUs with one made faulty: its real kernel's output
corrupted, FAIL on that GPU only, the kernel and the step named.

No tolerance: it is the same arithmetic.  Fields that differ by design and are excluded, by name:
  * result file: the status block's `backend`, `compute_capability` and `device_name` (what ran
    it), and what `coppelius diff` reports apart as time-dependent (wall time, the timestamp
    table, the semaphores' timestamps, file times) and environment fields (driver version, GPU
    UUID, PCI bus id, identity flags, inode);
  * digests file: `backend`, `device`, `target`, `compute_capability`, `driver_version`, `made`
    (how the backend issued the step: one submission, or its CUDA graph) and the
    `content_sha256` over them, each launch's `code` (the Triton source's digest on the
    interpret backend, the PTX's on cuda), and the contents of the regions the file itself marks
    `volatile` (a semaphore's timestamp: recorded, never compared, as `bisect` does);
  * checkpoint: nothing (byte for byte).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coppelius.forensics.diff import compare
from coppelius.plan import profiles
from coppelius.results.reader import read
from coppelius.staging import synthetic
from tests.support import stub_driver
from tests.support.paths import ROOT

PATHS = ("interpret", "fake", "stub")
STATUS_BY_DESIGN = {"status.backend", "status.compute_capability", "status.device_name"}
DIGESTS_BY_DESIGN = {"backend", "device", "target", "compute_capability", "driver_version",
                     "made", "content_sha256"}
LAUNCH_BY_DESIGN = {"code"}
TIMEOUT_S = 1200
FAULTY_KERNEL = "matmul_swiglu"          # tests/support/stub_cuda/execute.c's default


def command(path: str, *args) -> tuple[list, dict | None]:
    """The argv and environment of `coppelius ARGS` on one of PATHS."""
    if path == "interpret":
        return [sys.executable, "-m", "coppelius.cli", *args, "--backend", "interpret"], None
    if path == "fake":
        return [sys.executable, "-m", "tools.cpu_cuda", *args, "--backend", "cuda"], None
    return [sys.executable, "-m", "coppelius.cli", *args, "--backend", "cuda"], None


def run_all(tmp: Path, stub: Path, label: str, make_args) -> dict:
    """One command on every path at once; their outcomes by path."""
    procs = {}
    for path in PATHS:
        d = tmp / path
        d.mkdir(exist_ok=True)
        argv, env = command(path, *map(str, make_args(d)))
        if path == "stub":
            env = stub_driver.env(d / "stub.log", stub, execute=True, COPPELIUS_STUB_QUIET=1)
        procs[path] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = {}
    for path, p in procs.items():
        stdout, stderr = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, (f"{label} on {path} failed (exit {p.returncode}):\n"
                                   f"{stderr[-3000:]}")
        out[path] = stdout
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    stub = stub_driver.built_or_skip()
    tmp = tmp_path_factory.mktemp("cpu-cuda")
    for path in PATHS:
        (tmp / path).mkdir()
        (tmp / path / "tiny.ckpt").write_bytes(b"")

    def fresh(d):
        return ["run", "--profile", "tiny", "--quiet", "--steps", 1, "--directory",
                tmp / "stream", "--checkpoint", d / "tiny.ckpt", "--result", d / "fresh.bin",
                "--digests", d / "digests.json", "--digest-step", 0]

    def continued(d):
        return ["run", "--profile", "tiny", "--quiet", "--steps", 1, "--directory",
                tmp / "stream", "--checkpoint", d / "tiny.ckpt", "--result", d / "continued.bin"]

    synthetic.ensure_default_stream(profiles.get("tiny"), tmp / "stream")   # before 3 readers
    run_all(tmp, stub, "the fresh run", fresh)
    for path in PATHS:
        shutil.copy(tmp / path / "tiny.ckpt", tmp / path / "fresh.ckpt")
    run_all(tmp, stub, "the continued run", continued)
    for path in PATHS[1:]:
        log = tmp / path / "stub.log"
        assert not stub_driver.violations(log), stub_driver.violations(log)
    return tmp, stub


def _result_difference(a: Path, b: Path) -> list[str]:
    """What differs between two result files beyond the fields that differ by design."""
    rep = compare(read(a), read(b))
    out = list(rep["structure"])
    for s in rep["sections"]:
        if s["section"] == "status":
            extra = set(s.get("fields", ())) - STATUS_BY_DESIGN
            if extra:
                out.append(f"status fields {sorted(extra)}")
        elif s["differing"]:
            out.append(f"{s['section']}: {s['differing']} differ, first {s['first']}")
    return out


@pytest.mark.parametrize("path", PATHS[1:])
@pytest.mark.parametrize("which", ["fresh", "continued"])
def test_the_result_file_is_the_interpret_backends(runs, path, which):
    tmp, _ = runs
    a, b = tmp / "interpret" / f"{which}.bin", tmp / path / f"{which}.bin"
    assert read(b).status["backend"] != read(a).status["backend"]      # it did run on cuda
    assert _result_difference(a, b) == []
    assert a.stat().st_size == b.stat().st_size


@pytest.mark.parametrize("path", PATHS[1:])
def test_the_checkpoints_are_the_interpret_backends_byte_for_byte(runs, path):
    tmp, _ = runs
    for name in ("fresh.ckpt", "tiny.ckpt"):
        assert (tmp / path / name).read_bytes() == (tmp / "interpret" / name).read_bytes(), name


REGION_LAYOUT = {"name", "space", "offset", "run", "repeat", "stride", "dtype", "count",
                 "volatile"}


def _region(r: dict) -> dict:
    return {k: v for k, v in r.items() if k in REGION_LAYOUT} if r.get("volatile") else r


def _comparable(doc: dict) -> dict:
    out = {k: v for k, v in doc.items() if k not in DIGESTS_BY_DESIGN}
    out["launches"] = [
        {k: ([_region(r) for r in v] if k in ("reads", "writes") else v)
         for k, v in launch.items() if k not in LAUNCH_BY_DESIGN}
        for launch in doc["launches"]]
    return out


@pytest.mark.parametrize("path", PATHS[1:])
def test_the_digests_are_the_interpret_backends(runs, path):
    """Every launch of the digested update: the same regions read and written, the same bits
    (each region's sha256 and statistics), the replay matching the issue."""
    tmp, _ = runs
    a = json.loads((tmp / "interpret" / "digests.json").read_text())
    b = json.loads((tmp / path / "digests.json").read_text())
    assert b["backend"] == "cuda" and b["replay_matches_issue"]
    ca, cb = _comparable(a), _comparable(b)
    for la, lb in zip(ca["launches"], cb["launches"]):
        assert la == lb, f"launch #{la['index']} {la['label']} differs"
    assert ca == cb


def test_node_on_the_stub_names_the_corrupted_kernel_and_step(runs, tmp_path):
    """Two stub GPUs computing on the CPU, GPU 1 faulty: its SwiGLU product's first stored
    element has bit 0 flipped at step 0's update (the issue and its digest replay).  Against the
    stub's own fresh run (itself equal to the interpret backend's, above): GPU 0 PASS, GPU 1
    FAIL, and its digests name the kernel — `coppelius bisect` agrees, at step 0."""
    tmp, stub = runs
    env = stub_driver.env(tmp_path / "stub.log", stub, execute=True, COPPELIUS_STUB_QUIET=1,
                          COPPELIUS_STUB_DEVICES=2, COPPELIUS_STUB_FAULTY=1)
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "node", "--profile", "tiny",
                        "--steps", "1", "--digests", "--expect", tmp / "stub" / "fresh.bin",
                        "--json", "--work", tmp_path / "node"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 1, r.stderr[-3000:]
    report = json.loads(r.stdout)
    verdicts = {g["index"]: g["verdict"] for g in report["gpus"]}
    assert verdicts == {0: "PASS", 1: "FAIL"}, report
    kernel = report["gpus"][1]["kernel"]
    assert kernel and kernel["kernel"].startswith(FAULTY_KERNEL), kernel
    assert kernel["label"] == "layers.0.mlp.swiglu" and kernel["verdict"] == "diverged", kernel
    assert stub_driver.stats(tmp_path / "stub.log").get("corrupted", 0) > 0
    digests = sorted((tmp_path / "node").rglob("digests.json"))
    assert len(digests) == 2, digests
    b = subprocess.run([sys.executable, "-m", "coppelius.cli", "bisect", "--json", *digests],
                       cwd=ROOT, capture_output=True, text=True)
    assert b.returncode == 1, b.stdout[-2000:] + b.stderr[-2000:]
    first = json.loads(b.stdout)["first"]
    assert first["label"] == "layers.0.mlp.swiglu" and first["function"] == FAULTY_KERNEL, first
    doc = json.loads(digests[1].read_text())
    assert doc["step"] == 0
