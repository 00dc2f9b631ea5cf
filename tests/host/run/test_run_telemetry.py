"""A run on the cuda backend records its GPU's telemetry beside its result file (docs/FORMATS.md
§12), through the real cuda-bindings over the C stub driver and the real nvidia-ml-py over the C
stub of libnvidia-ml.so.1: samples at the start, at each publication and at the end, whose
readings are the stub's for that GPU, shown by `coppelius inspect`; without the library the run
still exits 0 and the file says why telemetry was unavailable; a file that cannot be written is one
warning.  In process, on the fake driver: the same, and a run interrupted before its first step
leaves no telemetry file (as it leaves no result file)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coppelius.plan import profiles
from coppelius.results import telemetry_file as TF
from tests.support import stub_driver, stub_nvml
from tests.support.paths import ROOT

TIMEOUT_S = 300
TINY = profiles.get("tiny")
UUID = "GPU-636f7070-656c-6975-732d-6770{:08x}"      # stub_cuda/devices.c: GPU K's
PCI = "0000:{:02x}:00.0"                              # ... and its bus: 0x18 + 0x10·K


@pytest.fixture(scope="module")
def stub() -> Path:
    return stub_driver.built_or_skip()


@pytest.fixture(scope="module")
def nvml() -> Path:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the nvml extra) is not installed")
    lib = stub_nvml.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    return lib


def coppelius(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def test_a_run_records_its_gpus_telemetry_and_inspect_shows_it(stub, nvml, tmp_path):
    gpu = 1             # the second of two stub GPUs: the file names the one the run opened
    env = stub_nvml.with_library(stub_driver.env(
        tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, COPPELIUS_STUB_DEVICES=2,
        COPPELIUS_STUB_NVML_ECC=gpu, COPPELIUS_STUB_NVML_SLOWDOWN=gpu), nvml)
    r = coppelius(env, "run", "--profile", "tiny", "--quiet", "--device", str(gpu),
                  "--directory", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    result = tmp_path / "w" / "tiny-result-c0.bin"
    doc = TF.read(TF.path_for(result))
    assert (doc["result"], doc["c0"], doc["available"], doc["reason"]) == (result.name, 0, True,
                                                                           None)
    assert doc["gpu"]["index"] == gpu and doc["gpu"]["uuid"] == UUID.format(gpu)
    assert doc["gpu"]["pci_bus_id"] == PCI.format(0x18 + 0x10 * gpu) and doc["host"]
    interval = TINY.checkpoint_interval
    assert [(s["phase"], s["update_count"]) for s in doc["samples"]] == (
        [("start", 0)] + [("publication", n) for n in range(interval, TINY.steps + 1, interval)]
        + [("end", TINY.steps)])
    for s in doc["samples"]:                     # stub_nvml/README.md: GPU K's fixed readings
        assert s["readings"] == {
            "temperature_c": 40 + gpu, "power_w": 300.0 + gpu, "sm_clock_mhz": 1980,
            "memory_clock_mhz": 3201, "throttle_reasons": 0x8, "ecc_volatile_corrected": 0,
            "ecc_volatile_uncorrected": 1, "retired_pages_pending": 0, "row_remap_pending": 1,
            "row_remap_failure": 0}
    assert [s["t_s"] for s in doc["samples"]] == sorted(s["t_s"] for s in doc["samples"])

    shown = coppelius(env, "inspect", str(result))
    assert shown.returncode == 0, shown.stderr
    assert (f"telemetry of GPU {gpu} {UUID.format(gpu)} ({PCI.format(0x18 + 0x10 * gpu)})"
            in shown.stdout)
    assert ("telemetry: 41 °C, 301 W, 1980 MHz SM, 3201 MHz mem, throttle 0x8, ECC volatile 0/1 "
            "(corr./uncorr.), retired pages pending no, row remap pending yes") in shown.stdout
    info = json.loads(coppelius(env, "inspect", str(result), "--json").stdout)
    assert info["telemetry"]["samples"] == doc["samples"] and info["telemetry"]["error"] is None


def test_without_the_library_the_run_exits_0_and_records_why(stub, tmp_path):
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1)
    r = coppelius(env, "run", "--profile", "tiny", "--steps", "1", "--quiet", "--directory",
                  str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    assert "telemetry" not in r.stderr                 # unavailable is no warning
    result = tmp_path / "w" / "tiny-result-c0.bin"
    doc = TF.read(TF.path_for(result))
    assert doc["available"] is False and doc["samples"] == []
    assert doc["reason"].startswith("telemetry unavailable: ")
    assert doc["gpu"]["uuid"] == UUID.format(0)
    shown = coppelius(env, "inspect", str(result))
    assert shown.returncode == 0 and doc["reason"] in shown.stdout


def test_an_unwritable_telemetry_file_is_a_warning_not_a_failure(stub, tmp_path):
    """A directory where the telemetry file should be: the run completes, says so once."""
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1)
    (tmp_path / "w").mkdir()
    TF.path_for(tmp_path / "w" / "tiny-result-c0.bin").mkdir()
    r = coppelius(env, "run", "--profile", "tiny", "--steps", "1", "--quiet", "--directory",
                  str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning: cannot write the telemetry file") == 1, r.stderr
    assert "completed: 1/1 step" in r.stderr


# ---- in process, the cuda backend's own path on the fake driver (tools/fake_driver.py): its GPU
# is one no NVML knows, so telemetry is unavailable wherever this runs
class _Quiet:
    """Progress hooks; `at_start` runs when the forward is about to be issued."""

    def __init__(self, at_start=None):
        self.at_start, self.notes = at_start, []

    def start(self, *a):
        if self.at_start is not None:
            self.at_start()

    def step(self, *a): ...
    def published(self, *a): ...
    def stop(self): ...

    def note(self, text):
        self.notes.append(text)


def _fake_run(tmp_path, monkeypatch, progress, steps=TINY.steps):
    from coppelius.run.loop import Request, run
    from tests.support.fake_driver_fixture import install_for_runs
    install_for_runs(monkeypatch)
    (tmp_path / "c.ckpt").write_bytes(b"")                  # a fresh start
    return run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "r.bin",
                       directory=tmp_path / "run", steps=steps), progress)


def test_on_the_fake_driver_the_file_says_why_and_the_run_completes(tmp_path, monkeypatch):
    progress = _Quiet()
    summary = _fake_run(tmp_path, monkeypatch, progress, steps=1)
    assert summary.exit_code == 0 and progress.notes == []
    doc = TF.read(TF.path_for(tmp_path / "r.bin"))
    assert doc["available"] is False and doc["reason"].startswith("telemetry unavailable: ")
    assert doc["gpu"]["uuid"].startswith("GPU-") and doc["result"] == "r.bin"


def test_a_run_interrupted_before_its_first_step_leaves_no_telemetry_file(tmp_path, monkeypatch):
    """As it leaves no result file: nothing of the run is there to describe."""
    from coppelius.run.loop import RunInterrupted
    progress = _Quiet(at_start=lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunInterrupted):
        _fake_run(tmp_path, monkeypatch, progress)
    assert not (tmp_path / "r.bin").exists()
    assert not TF.path_for(tmp_path / "r.bin").exists()
