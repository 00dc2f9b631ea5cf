"""The verdicts where operators look: the shipped Slurm node check (run as a Prolog would run it,
over the C stub driver with two GPUs, one made faulty by the stub's test hook) writes its metrics
into node exporter's textfile directory; a real node exporter (only its textfile collector) and a
real Prometheus (Debian's packages, on free loopback ports, a scratch TSDB) scrape them with the
shipped alert rules loaded; Prometheus' HTTP query API then finds the faulty GPU by UUID, and the
rule's alert fires for it, its description naming the first difference.

The queries and the rules name the metrics as an operator does, so renaming the verdict metric
fails this test.  Both daemons are stopped by PID and checked gone, whatever the outcome."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from coppelius.slurm import path as script
from tests.support import stub_driver
from tests.support.paths import ROOT
from tests.support.prometheus import PROMTOOL, Monitoring, why_unavailable
from tests.support.slurm import alive

pytestmark = pytest.mark.prometheus

NODE = "gpu-node-7"             # the node's name as the check labels it (SLURMD_NODENAME)
FAULTY = 1
GPUS = 2
RUN_ARGS = "--profile tiny --backend cuda --steps 1"
UUID = "GPU-636f7070-656c-6975-732d-6770{:08x}"        # devices.c: "coppelius-gp" + the index
COPPELIUS = f"{sys.executable} -m coppelius.cli"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stub():
    why = why_unavailable()
    if why is not None:
        if os.environ.get("COPPELIUS_REQUIRE_PROMETHEUS"):
            pytest.fail(f"COPPELIUS_REQUIRE_PROMETHEUS is set, and {why}")
        pytest.skip(why)
    return stub_driver.built_or_skip()


def _coppelius(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*COPPELIUS.split(), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_prometheus_finds_the_faulty_gpu_by_uuid(stub, tmp_path):
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1,
                          COPPELIUS_STUB_DEVICES=GPUS)
    rules = tmp_path / "coppelius-rules.yml"
    made = _coppelius("fleet-script", "rules", "-o", str(rules), env=env)
    assert made.returncode == 0, made.stderr
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "known-good").mkdir()
    expect = tmp_path / "known-good.bin"
    good = _coppelius("run", "--quiet", "--directory", str(tmp_path / "known-good"), "--result",
                      str(expect), *RUN_ARGS.split(), env=env)
    assert good.returncode == 0, good.stderr
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    started = time.monotonic()
    with Monitoring(tmp_path / "monitoring", textfile, (rules,)) as m:
        pids = m.pids
        check = subprocess.run(
            ["bash", str(script("node-check"))], capture_output=True, text=True,
            timeout=TIMEOUT_S, env=dict(
                env, COPPELIUS_STUB_FAULTY=str(FAULTY), COPPELIUS_EXPECT=str(expect),
                COPPELIUS=COPPELIUS, COPPELIUS_ARGS=RUN_ARGS, COPPELIUS_GPUS="0 1",
                COPPELIUS_METRICS=str(textfile / "coppelius.prom"), SLURMD_NODENAME=NODE,
                COPPELIUS_NODE_CHECK_CONF="/nonexistent"))
        print(check.stdout, check.stderr)
        assert check.returncode == 1, check.stdout + check.stderr
        assert f"node {NODE} GPU {FAULTY} FAIL" in check.stdout
        # what an alert rule asks: which GPU failed, by UUID
        failed = m.wait_for('coppelius_gpu_verdict{verdict="FAIL"} == 1')
        assert [(s["metric"]["UUID"], s["metric"]["Hostname"], s["metric"]["index"])
                for s in failed] == [(UUID.format(FAULTY), NODE, str(FAULTY))], failed
        passed = m.query('coppelius_gpu_verdict{verdict="PASS"} == 1')
        assert [s["metric"]["UUID"] for s in passed] == [UUID.format(0)], passed
        # node exporter read the file without complaint
        errors = m.query('node_textfile_scrape_error')
        assert [s["value"][1] for s in errors] == ["0"], errors
        firing = m.wait_for('ALERTS{alertname="CoppeliusGpuFailed",alertstate="firing"}')
        assert [s["metric"]["UUID"] for s in firing] == [UUID.format(FAULTY)], firing
        alert = next(a for a in m.alerts() if a["labels"]["alertname"] == "CoppeliusGpuFailed")
        assert "First difference: section" in alert["annotations"]["description"], alert
        print(f"the verdict, the alert and its description in {time.monotonic() - started:.1f} s")
    assert not [p for p in pids if alive(p)], "a monitoring daemon outlived the test"
