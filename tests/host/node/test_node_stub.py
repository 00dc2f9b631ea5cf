"""`coppelius node` end to end over the real cuda-bindings and the C stub driver with several GPUs
(tests/support/stub_cuda/devices.c): distinct UUIDs and PCI bus ids, --device on run and doctor,
the identity in the result file, one GPU made faulty (FAIL with the first difference, named by
index, UUID and PCI bus id in the table, the JSON and the JUnit XML; exit 1), none faulty (exit 0),
one process killed mid-run and one hung (FAIL with how they ended; the others finish)."""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from coppelius.results import telemetry_file as TF
from coppelius.results.reader import read
from tests.support import stub_driver
from tests.support.paths import ROOT

TIMEOUT_S = 300
UUID = "GPU-636f7070-656c-6975-732d-6770{:08x}"      # devices.c: "coppelius-gp" + the index


def pci(k: int) -> str:
    return f"0000:{0x18 + 0x10 * k:02x}:00.0"


@pytest.fixture(scope="module")
def stub() -> Path:
    return stub_driver.built_or_skip()


def coppelius(stub: Path, tmp_path: Path, *args: str, **settings) -> subprocess.CompletedProcess:
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, **settings)
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def test_device_selects_a_gpu_and_the_result_names_it(stub, tmp_path):
    d = coppelius(stub, tmp_path, "doctor", "--profile", "tiny", "--device", "1", "--json",
                  COPPELIUS_STUB_DEVICES=3, CUDA_VISIBLE_DEVICES="2,1")
    checks = {c["name"]: c["value"] for c in json.loads(d.stdout)["checks"]}
    assert checks["gpu"] == f"device 1: {UUID.format(1)}, PCI bus id {pci(1)}", checks
    r = coppelius(stub, tmp_path, "run", "--profile", "tiny", "--steps", "1", "--quiet",
                  "--device", "0", "--directory", str(tmp_path / "w"), COPPELIUS_STUB_DEVICES=3,
                  CUDA_VISIBLE_DEVICES="2,1")
    assert r.returncode == 0, r.stderr
    ident = read(tmp_path / "w" / "tiny-result-c0.bin").gpu_identity()
    assert ident["gpu_uuid"] == UUID.format(2) and ident["pci_bus_id"] == pci(2)
    assert ident["host_name"]
    shown = coppelius(stub, tmp_path, "inspect", str(tmp_path / "w" / "tiny-result-c0.bin"))
    assert f"GPU {UUID.format(2)}, PCI bus id {pci(2)}" in shown.stdout
    bad = coppelius(stub, tmp_path, "run", "--profile", "tiny", "--steps", "1", "--device", "2",
                    "--directory", str(tmp_path / "x"), COPPELIUS_STUB_DEVICES=2)
    assert bad.returncode == 2 and "no CUDA device 2 (2 found)" in bad.stderr
    assert not (tmp_path / "x" / "tiny-result-c0.bin").exists()


def test_node_names_the_faulty_gpu(stub, tmp_path):
    junit = tmp_path / "node.xml"
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "2", "--work",
                  str(tmp_path / "n"), "--json", "--junit", str(junit),
                  COPPELIUS_STUB_DEVICES=3, COPPELIUS_STUB_FAULTY=1)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["schema"] == "coppelius-node/1"
    assert [(g["index"], g["uuid"], g["pci_bus_id"], g["verdict"]) for g in rep["gpus"]] == [
        (k, UUID.format(k), pci(k), "FAIL" if k == 1 else "PASS") for k in range(3)]
    fd = rep["gpus"][1]["first_difference"]
    assert fd["section"] == "forward" and "row 255 logits" in fd["where"]
    case = ET.parse(junit).findall(".//testcase")[1]
    assert UUID.format(1) in case.get("name") and pci(1) in case.get("name")
    assert "section forward" in case.find("failure").get("message")
    table = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                      str(tmp_path / "t"), "--expect", rep["gpus"][0]["result"],
                      COPPELIUS_STUB_DEVICES=2, COPPELIUS_STUB_FAULTY=1)
    assert table.returncode == 1
    line = next(x for x in table.stdout.splitlines() if UUID.format(1) in x)
    assert "FAIL" in line and pci(1) in line and "forward" in line


def test_node_passes_when_none_is_faulty(stub, tmp_path):
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), COPPELIUS_STUB_DEVICES=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 2 and "2 pass, 0 fail" in r.stdout


def test_a_killed_and_a_hung_gpu_fail_and_the_others_finish(stub, tmp_path):
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "2", "--work",
                  str(tmp_path / "n"), "--json", "--timeout", "20",
                  COPPELIUS_STUB_DEVICES=4, COPPELIUS_STUB_DIE=1, COPPELIUS_STUB_HANG=2)
    assert r.returncode == 1, r.stderr
    g = json.loads(r.stdout)["gpus"]
    assert [x["verdict"] for x in g] == ["PASS", "FAIL", "FAIL", "PASS"]
    assert g[1]["process"]["status"] == "killed by SIGKILL"
    assert g[2]["process"]["hung"] and "hung" in g[2]["reason"]
    assert read(g[3]["result"]).outcome == "completed"


def test_node_without_a_gpu_could_not_run(stub, tmp_path):
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--work", str(tmp_path / "n"),
                  CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 2 and "could not run" in r.stderr


def test_telemetry_through_nvidia_ml_py_and_the_stub_library(stub, tmp_path):
    from tests.support import stub_nvml
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the nvml extra) is not installed")
    lib = stub_nvml.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    settings = dict(COPPELIUS_STUB_DEVICES=2, COPPELIUS_STUB_NVML_ECC=1,
                    COPPELIUS_STUB_NVML_SLOWDOWN=0)
    env = stub_nvml.with_library(
        stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, **settings), lib)
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "node", "--profile", "tiny",
                        "--steps", "1", "--work", str(tmp_path / "n"), "--json",
                        "--telemetry-interval", "0.2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["telemetry"]["available"]
    for k, g in enumerate(rep["gpus"]):
        phases = [s["phase"] for s in g["telemetry"]]
        assert phases[0] == "start" and phases[-1] == "end"
        s = g["telemetry"][-1]
        assert (s["temperature_c"], s["power_w"], s["sm_clock_mhz"], s["memory_clock_mhz"]) == (
            40 + k, 300.0 + k, 1980, 3201)
        assert s["ecc_volatile_uncorrected"] == k and s["row_remap_pending"] == k
        assert s["throttle_reasons"] == (0x8 if k == 0 else 0)
        assert s["retired_pages_pending"] == 0
        # the GPU's own run recorded its telemetry beside its result: start, publication, end
        own = TF.read(g["telemetry_file"])
        assert own["gpu"]["uuid"] == g["uuid"] and own["available"]
        assert [x["phase"] for x in own["samples"]] == ["start", "publication", "end"]
        assert own["samples"][-1]["readings"]["temperature_c"] == 40 + k
    table = subprocess.run([sys.executable, "-m", "coppelius.cli", "node", "--profile", "tiny",
                            "--steps", "1", "--work", str(tmp_path / "t")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    assert "telemetry GPU 1: 41 °C, 301 W" in table.stdout and "row remap pending yes" in table.stdout


def test_without_the_library_telemetry_is_unavailable_and_the_exit_unaffected(stub, tmp_path):
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), COPPELIUS_STUB_DEVICES=1)
    assert r.returncode == 0, r.stderr
    assert "telemetry unavailable" in r.stdout


def test_node_soak_and_digests_per_gpu(stub, tmp_path):
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), "--soak", "2", "--json",
                  COPPELIUS_STUB_DEVICES=3, COPPELIUS_STUB_FAULTY=2)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["digests"] and rep["soak"] == 2
    for g in rep["gpus"]:
        assert g["soak"] == {"repetitions": 2, "verdict": "no transient fault", "transient": []}
    # the stub corrupts the forward record's copy, which no update launch makes
    assert rep["gpus"][2]["verdict"] == "FAIL"
    assert rep["gpus"][2]["kernel"] == {"launch": None,
                                        "why": "no launch of update step 0 differs"}


def test_a_signalled_node_stops_its_children(stub, tmp_path):
    import os
    import signal
    import time
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1,
                          COPPELIUS_STUB_DEVICES=2, COPPELIUS_STUB_HANG="0,1")
    p = subprocess.Popen([sys.executable, "-m", "coppelius.cli", "node", "--profile", "tiny",
                          "--steps", "2", "--work", str(tmp_path / "n")], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = [tmp_path / "n" / f"gpu{k}" / "run.log" for k in range(2)]
    deadline = time.monotonic() + 120
    while not all(x.exists() for x in logs) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode != 0
    alive = subprocess.run(["pgrep", "-f", str(tmp_path / "n")], capture_output=True, text=True)
    assert alive.stdout.strip() == "", f"children left running: {alive.stdout}"
    assert os.path.isdir(tmp_path / "n")
