"""The fleet path on a real Slurm: three nodes on this host (one slurmd each, a fake GPU each), the
shipped job array running `coppelius run` on the cuda backend over the C stub driver (each node's
stub GPU its own UUID, one made faulty through the stub's test hook), the shipped gather step's
classes, verdicts and Prometheus metrics, and the shipped node check as a Prolog that drains the
faulty node and writes each node's metrics.  The metrics are read with prometheus-client's own
parser.

The scripts run are the files the package ships (coppelius.slurm.path), never copies; the test's
only additions are cluster configuration: a TaskProlog that gives each node's tasks its stub GPU
(what a real node's driver would be) and a Prolog wrapper that sets the node check's settings
(what /etc/default/coppelius-node-check holds on a real node).  Every daemon is stopped by PID,
whatever the outcome, and checked gone; all state lives in the test's temporary directory.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coppelius import forensics
from coppelius.slurm import path as script
from tests.support import stub_driver
from tests.support.slurm import Cluster, alive, why_unavailable

pytestmark = pytest.mark.slurm

NODES = 3
FAULTY = "n2"
RUN_ARGS = ("--profile", "tiny", "--backend", "cuda", "--steps", "2")
JOB_TIMEOUT_S = 120
# the stub's per-process settings that stand for a node's own driver: which physical GPU of the
# stub's fleet the node holds, and the test-only hook that makes one faulty (stub_cuda/README.md)
STUB_NODE_ENV = "COPPELIUS_STUB_FIRST_GPU"
STUB_FAULT_ENV = "COPPELIUS_STUB_FAULTY"
COPPELIUS = f"{sys.executable} -m coppelius.cli"


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    why = why_unavailable()
    if why is not None:
        if os.environ.get("COPPELIUS_REQUIRE_SLURM"):
            pytest.fail(f"COPPELIUS_REQUIRE_SLURM is set, and {why}")
        pytest.skip(why)
    lib = stub_driver.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    return lib


def _job_env(stub: Path, log: Path) -> dict:
    """What sbatch exports to every task: the stub as libcuda, the command."""
    env = stub_driver.env(log, stub, base={})
    return {"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"], stub_driver.LOG_ENV: str(log),
            "COPPELIUS": COPPELIUS}


def _verdicts(metrics: Path) -> dict[tuple[str, str, str], str]:
    """(Hostname, index, UUID) → the verdict whose series is 1, from a metrics file."""
    out = {}
    for family in text_string_to_metric_families(metrics.read_text()):
        if family.name == "coppelius_gpu_verdict":
            for s in family.samples:
                if s.value == 1:
                    key = (s.labels["Hostname"], s.labels["index"], s.labels["UUID"])
                    assert key not in out, s
                    out[key] = s.labels["verdict"]
    return out


def _node_gpu(node: str) -> int:
    """The physical stub GPU node nK holds: K - 1."""
    return int(node[1:]) - 1


def _node_env_lines(prefix: str) -> str:
    """Shell lines that give this node's processes its own stub GPU, and the faulty node's its
    fault (a node's driver, in a real cluster): `prefix` is `echo "export ` for a TaskProlog
    (its output sets the task's environment), `export ` for a Prolog."""
    end = '"' if prefix.startswith("echo") else ""
    return (f'{prefix}{STUB_NODE_ENV}=$((${{SLURMD_NODENAME#n}} - 1)){end}\n'
            f'if [ "$SLURMD_NODENAME" = {FAULTY} ]; then '
            f'{prefix}{STUB_FAULT_ENV}={_node_gpu(FAULTY)}{end}; fi\n')


def _stub_uuid(node: str) -> str:
    """The UUID of node's stub GPU (stub_cuda/devices.c: "coppelius-gp" + its index)."""
    return f"GPU-636f7070-656c-6975-732d-6770{_node_gpu(node):08x}"


def _task_prolog(where: Path) -> Path:
    p = where / "task-prolog.sh"
    p.write_text("#!/bin/bash\n" + _node_env_lines('echo "export ') + "exit 0\n")
    p.chmod(0o755)
    return p


def _known_good(stub: Path, where: Path) -> Path:
    """The reference: the same invocation on a healthy stub GPU, outside Slurm."""
    out = where / "known-good.bin"
    env = stub_driver.env(where / "known-good-stub.log", stub)
    r = subprocess.run([*shlex.split(COPPELIUS), "run", "--quiet", "--directory",
                        str(where / "known-good"), "--result", str(out), *RUN_ARGS],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_the_job_array_the_gather_and_the_prolog_on_three_nodes(stub, tmp_path):
    (tmp_path / "known-good").mkdir()
    expect = _known_good(stub, tmp_path)
    results = tmp_path / "results"
    extra = (f"TaskProlog={_task_prolog(tmp_path)}",)
    started = time.monotonic()
    with Cluster(tmp_path / "slurm", NODES, extra) as cluster:
        pids = cluster.pids
        env = _job_env(stub, tmp_path / "stub.log")
        job = cluster.run("sbatch", "--parsable", f"--array=0-{NODES - 1}",
                          "-o", str(tmp_path / "array-%a.log"), "--export=ALL",
                          str(script("array")), str(results), *RUN_ARGS, env=env).stdout.strip()
        cluster.wait_job(job, JOB_TIMEOUT_S)
        logs = {p.name: p.read_text() for p in sorted(tmp_path.glob("array-*.log"))}
        print(f"array job {job} done in {time.monotonic() - started:.1f} s", *logs.values(),
              sep="\n")
        ran_on = sorted(line.split()[2] for text in logs.values() for line in text.splitlines()
                        if line.startswith("coppelius-array: node "))
        assert ran_on == cluster.names, logs          # every task on its own node
        assert sorted(p.stem for p in results.glob("*.bin")) == cluster.names, logs
    assert not [p for p in pids if alive(p)], "a Slurm daemon outlived the cluster"

    uuids = {p.stem: forensics.read_result(p).records["status"]["gpu_uuid"]
             for p in results.glob("*.bin")}
    assert len(set(uuids.values())) == NODES, uuids          # each node its own GPU
    metrics = tmp_path / "fleet.prom"
    gather = subprocess.run(["bash", str(script("gather")), str(results), str(expect)],
                            env={**os.environ, "COPPELIUS": COPPELIUS,
                                 "COPPELIUS_METRICS": str(metrics)}, capture_output=True,
                            text=True, timeout=120)
    print(gather.stdout, gather.stderr)
    assert gather.returncode == 1, gather.stdout + gather.stderr
    classes = json.loads((results / "classes.json").read_text())["classes"]
    members = sorted(sorted(Path(m).stem for m in c["members"]) for c in classes)
    assert members == sorted([[FAULTY], sorted(set(cluster.names) - {FAULTY})]), classes
    verdicts = dict(line.split(" ", 2)[1:] for line in
                    (results / "verdicts.txt").read_text().splitlines())
    assert {n: v.split(":")[0] for n, v in verdicts.items()} == {
        n: "FAIL" if n == FAULTY else "PASS" for n in cluster.names}, verdicts
    assert "first difference" in verdicts[FAULTY], verdicts
    # the sweep's metrics: each node's GPU under the node's name and its own UUID
    assert _verdicts(metrics) == {(n, "", _stub_uuid(n)): "FAIL" if n == FAULTY else "PASS"
                                  for n in cluster.names}, metrics.read_text()


def _prolog(where: Path, stub: Path, expect: Path) -> Path:
    """The Prolog slurm.conf names: the node check's settings (on a real node, the file
    /etc/default/coppelius-node-check), this node's stub GPU, then the shipped script itself."""
    p = where / "prolog.sh"
    p.write_text("#!/bin/bash\n"
                 f"export COPPELIUS_EXPECT={shlex.quote(str(expect))}\n"
                 f"export COPPELIUS={shlex.quote(COPPELIUS)}\n"
                 f"export COPPELIUS_ARGS={shlex.quote(' '.join(RUN_ARGS))}\n"
                 f"export LD_LIBRARY_PATH={shlex.quote(str(stub))}\n"
                 f"export COPPELIUS_NODE_CHECK_CONF=/nonexistent\n"
                 f"export COPPELIUS_METRICS={where}/metrics/$SLURMD_NODENAME.prom\n"
                 + _node_env_lines("export ") +
                 f"bash {shlex.quote(str(script('node-check')))} >> {where}/node-check.log 2>&1\n")
    p.chmod(0o755)
    return p


def test_the_node_check_as_a_prolog_drains_the_faulty_node(stub, tmp_path):
    (tmp_path / "known-good").mkdir()
    (tmp_path / "metrics").mkdir()
    expect = _known_good(stub, tmp_path)
    extra = (f"Prolog={_prolog(tmp_path, stub, expect)}",)
    with Cluster(tmp_path / "slurm", NODES, extra) as cluster:
        pids = cluster.pids
        jobs = {n: cluster.run("sbatch", "--parsable", "-w", n, "-o", str(tmp_path / f"{n}.out"),
                               "--wrap", "echo ran on $SLURMD_NODENAME").stdout.strip()
                for n in cluster.names}
        healthy = [n for n in cluster.names if n != FAULTY]
        for n in healthy:
            cluster.wait_job(jobs[n], JOB_TIMEOUT_S)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while cluster.states().get(FAULTY, "").rstrip("*") not in ("drain", "drng"):
            assert time.monotonic() < deadline, cluster.states()
            time.sleep(0.2)
        states = cluster.states()
        reason = cluster.run("scontrol", "show", "node", FAULTY).stdout
        held = cluster.run("squeue", "-h", "-j", jobs[FAULTY], "-o", "%T %r").stdout
        print(states, held, (tmp_path / "node-check.log").read_text(), sep="\n")
        assert "Reason=Prolog error" in reason, reason
        assert all(states[n] == "idle" for n in healthy), states
        assert held.split()[0] == "PENDING" and "held" in held, held
        assert all((tmp_path / f"{n}.out").read_text().strip() == f"ran on {n}" for n in healthy)
        assert not (tmp_path / f"{FAULTY}.out").exists() or \
            "ran on" not in (tmp_path / f"{FAULTY}.out").read_text()
        check = (tmp_path / "node-check.log").read_text()
        assert f"node {FAULTY} GPU 0 FAIL: first difference" in check, check
        assert all(f"node {n} GPU 0 PASS" in check for n in healthy), check
    assert not [p for p in pids if alive(p)], "a Slurm daemon outlived the cluster"
    # each node's metrics, where its node exporter's textfile collector would read them
    for n in cluster.names:
        assert _verdicts(tmp_path / "metrics" / f"{n}.prom") == {
            (n, "0", _stub_uuid(n)): "FAIL" if n == FAULTY else "PASS"}, n
