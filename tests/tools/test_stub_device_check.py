"""The device check in its GPU mode, through the real cuda-bindings and the C stub driver.

The phases whose verdict needs no arithmetic run as they will on a GPU machine: doctor, the
tiny and production runs' host path (runs, continuation, bit-identical reruns of the host's own
records), the full run's host loop, per-launch timing, the capture experiments, the
calibration's kernels (their parameters, shapes, shared memory and graphs through the real
bindings) and the sanitizer phase's commands (no compute-sanitizer here: the commands run
without it).  The stub computes no model math and runs no calibration kernel, so the numeric
verdicts (verify against numpy, the interpret golden) and the checks of what the calibration's
kernels record are expected to fail and are not asserted; any violation the stub logged fails
the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import stub_driver
from tools.gpu_check.calibration_model import GUARD
from tests.support.paths import ROOT

PHASES = ("doctor", "tiny", "production", "full-run", "per-launch", "experiments", "calibration",
          "sanitizer")
# words of the checks that need the GPU's arithmetic (calibrate.GUARD: what its kernels record)
NUMERIC = {"verify", "golden", GUARD}
BUDGET_S, TIMEOUT_S = 300, 600


def numeric(check: str) -> bool:
    return any(word in check for word in NUMERIC)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    lib = stub_driver.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    tmp = tmp_path_factory.mktemp("stub-check")
    out, log = tmp / "out", tmp / "stub.log"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    r = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_check.sh"), "--profile", "tiny", "--phases",
         ",".join(PHASES), "--out", str(out), "--budget", str(BUDGET_S)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
        env=stub_driver.env(log, lib, base={**env, "PY": sys.executable},
                            COPPELIUS_STUB_QUIET=1))
    return r, json.loads((out / "report.json").read_text()), log


def test_the_stub_saw_no_violation_in_any_process(checked):
    r, _, log = checked
    assert stub_driver.violations(log) == [], r.stdout[-3000:]
    assert stub_driver.loaded(log) >= len(PHASES), "the phases' processes did not load the stub"


def test_every_host_path_verdict_holds(checked):
    r, report, _ = checked
    assert report["mode"] == "gpu"
    phases = {p["name"]: p for p in report["phases"]}
    for name in PHASES:
        p = phases[name]
        assert p["status"] != "skipped", (name, p.get("reason"))
        failed = [c for c in p["checks"] if not c["ok"] and not numeric(c["check"])]
        assert not failed, (name, failed, r.stdout[-2000:])
    for name in ("doctor", "full-run", "per-launch", "experiments", "sanitizer"):
        assert phases[name]["status"] == "ok", (name, phases[name].get("reason"))


def test_the_runs_host_records_and_timing_come_back(checked):
    _, report, _ = checked
    phases = {p["name"]: p for p in report["phases"]}
    checks = {c["check"]: c["ok"] for c in phases["tiny"]["checks"]}
    assert checks["two fresh runs bit-identical (diff)"]       # the host's records: no arithmetic
    run = phases["production"]["run"]
    assert run["host_gap_us_p50"] > 0 and run["fence_to_fence_ms_p50"] > 0
    assert phases["full-run"]["run"]["outcome"] == "completed"
    assert phases["per-launch"]["launches"] > 0 and phases["per-launch"]["graph_us_p50"] > 0
    variants = {e.get("capture") for e in report["experiments"]}
    assert {"plan", "full-edges", "one-lane", "noop-side-lane"} <= variants
    # the calibration's figures the host times with events (the stub's clock is the host's)
    timed = {r["name"]: r["measured"] for r in report["calibration"]}
    for name in ("L2 read bandwidth", "HBM read bandwidth", "launch in a graph, full edge",
                 "launch in a graph, programmatic edge", "two co-resident CTAs, latency-bound"):
        assert timed[name] is not None and timed[name] > 0, name
