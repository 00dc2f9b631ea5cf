"""The verdicts as Prometheus metrics, read back with prometheus-client's own parser
(`text_string_to_metric_families`): every GPU's series and labels for PASS, FAIL (with its first
difference and first divergent kernel), TIE, ERROR and a soak, from synthetic node reports; the
NVML readings in base units; `coppelius node --metrics` end to end on the stub driver (the file
says what the JSON says) and on the stub NVML library; `coppelius metrics` over result files
with their telemetry files; and a metrics path in a missing directory or on a full disk: one line
with a hint, the node's verdicts and exit status unchanged, the last complete file kept and no
partial one left.

Metric names are written out here as an operator's rule writes them, never imported: renaming a
metric fails these tests."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coppelius.node import Invocation, judge, node_report
from coppelius.node.children import Child
from coppelius.node.metrics import NVML, MetricsRefused, check, from_report, write
from coppelius.node.targets import Target
from coppelius.plan import profiles as P
from coppelius.staging import layout as L
from coppelius.telemetry import READINGS
from tests.support import stub_driver
from tests.support.paths import ROOT
from tests.support.result_synth import synthesize


TIMEOUT_S = 300
STATES = ("PASS", "FAIL", "TIE", "ERROR")
STUB_UUID = "GPU-636f7070-656c-6975-732d-6770{:08x}"      # devices.c: "coppelius-gp" + the index


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-0000-0000-000000000000"


def pci(i: int) -> str:
    return f"0000:{0x18 + i:02x}:00.0"


def families(path: Path) -> dict[str, list]:
    """Family name → its samples, as prometheus-client parses the file."""
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def of(fams: dict, name: str, **labels) -> list:
    """The samples of family `name` whose labels include `labels`."""
    return [s for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]


def value(fams: dict, name: str, **labels):
    found = of(fams, name, **labels)
    assert len(found) <= 1, found
    return found[0].value if found else None


def verdicts(fams: dict, **labels) -> dict[str, float]:
    return {s.labels["verdict"]: s.value for s in of(fams, "coppelius_gpu_verdict", **labels)}


def _children(tmp_path: Path, flipped: set[int], n: int, rc: dict | None = None,
              cpu: bool = False) -> list:
    """n children whose results are synthetic files (those in `flipped` differ at step 1 row 7);
    a child whose run was refused (rc 2) left no result, as a refused run does."""
    syn = synthesize(P.get("tiny"), steps=2)
    out = []
    for i in range(n):
        d = tmp_path / f"gpu{i}"
        d.mkdir(parents=True)
        code = (rc or {}).get(i, 0)
        s = syn
        if i in flipped:
            w = syn.windows.copy()
            w[1, 7] = np.float32(-3.0)
            s = replace(syn, windows=w)
        if code != 2:
            s.write(d / "r.bin")
        t = Target(i, "cpu (triton interpreter)", "", "") if cpu else \
            Target(i, "NVIDIA H200", uuid(i), pci(i))
        out.append(Child(t, d, d / "r.bin", [], returncode=code, wall_s=10.0 + i,
                         ended_unix_s=1.8e9 + i,
                         stderr="coppelius: no CUDA device 7 (3 found) (hint: …)\n" if code == 2
                         else ""))
    return out


def _median_gap_s(result: Path) -> float:
    """The median host gap before an update, recomputed from the timestamp table's bytes."""
    from coppelius.results.reader import read
    ts = read(result).timestamps
    gap = ts["host_issue_ns"][1:].astype(np.int64) - ts["host_fence_ns"][:-1].astype(np.int64)
    return float(np.median(gap[ts["submission"][1:] == L.SUBMISSION_UPDATE])) / 1e9


KERNEL = {"launch": 7, "label": "layers.0.mlp.swiglu", "kernel": "matmul_swiglu",
          "verdict": "diverged", "regions": ["ab"]}


def test_pass_fail_with_kernel_error_and_soak_per_gpu(tmp_path):
    kids = _children(tmp_path, {1}, n=4, rc={2: 2})
    v = judge(kids)
    assert [x["verdict"] for x in v] == ["PASS", "FAIL", "ERROR", "PASS"]
    v[1]["kernel"] = dict(KERNEL)
    for i in (0, 1, 3):
        v[i]["soak"] = {"repetitions": 4, "verdict": "no transient fault", "transient": []}
    # GPU 3: a transient fault in repetition 2 fails a GPU whose result passed (node/kernels.py)
    v[3]["soak"] = {"repetitions": 4, "verdict": "1 transient fault", "transient": [
        {"repetition": 2, "launch": 9, "label": "x", "kernel": "k", "regions": ["y"]}]}
    v[3]["verdict"], v[3]["reason"] = "FAIL", "transient fault: repetition 2 of 4"
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2, soak=4), kids, v)
    out = tmp_path / "node.prom"
    write(from_report(rep), out)
    fams = families(out)

    expected = ["PASS", "FAIL", "ERROR", "FAIL"]
    for i, want in enumerate(expected):
        gpu = dict(Hostname=rep["host"], index=str(i), UUID=uuid(i), pci_bus_id=pci(i))
        assert verdicts(fams, **gpu) == {s: float(s == want) for s in STATES}, i
        assert value(fams, "coppelius_gpu_run_duration_seconds", **gpu) == 10.0 + i
        assert value(fams, "coppelius_gpu_last_run_timestamp_seconds", **gpu) == 1.8e9 + i
        info = of(fams, "coppelius_gpu_run_info", **gpu)
        assert [s.labels for s in info] == [dict(gpu, modelName="NVIDIA H200", profile="tiny",
                                                 backend="cuda", steps="2")]
        gap = value(fams, "coppelius_gpu_host_gap_median_seconds", **gpu)
        if want == "ERROR":                     # no result: no host gap, nothing invented
            assert gap is None
            assert value(fams, "coppelius_gpu_soak_repetitions", **gpu) is None
        else:
            assert gap == pytest.approx(_median_gap_s(kids[i].result), abs=1e-9)
            assert value(fams, "coppelius_gpu_soak_repetitions", **gpu) == 4
            assert value(fams, "coppelius_gpu_soak_transient_faults", **gpu) == (i == 3)
        assert value(fams, "coppelius_gpu_telemetry_samples", **gpu) == 0
    # every verdict series carries exactly the four GPU labels and the state
    assert {tuple(sorted(s.labels)) for s in fams["coppelius_gpu_verdict"]} == {
        ("Hostname", "UUID", "index", "pci_bus_id", "verdict")}
    diff = of(fams, "coppelius_gpu_first_difference_info")
    assert [(s.labels["UUID"], s.labels["section"], s.labels["where"]) for s in diff] == [
        (uuid(1), "steps", "step 1, row 7")]
    kernel = of(fams, "coppelius_gpu_first_divergent_kernel_info")
    assert [s.labels for s in kernel] == [dict(Hostname=rep["host"], index="1", UUID=uuid(1),
                                               pci_bus_id=pci(1), launch="7",
                                               label="layers.0.mlp.swiglu",
                                               kernel="matmul_swiglu", divergence="diverged")]
    # no NVML: none of its series is written
    assert not [n for n in fams if n.startswith(("coppelius_gpu_temperature",
                                                  "coppelius_gpu_ecc"))]


def test_a_tie_on_both_gpus(tmp_path):
    kids = _children(tmp_path, {1}, n=2)
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2), kids, judge(kids))
    write(from_report(rep), tmp_path / "tie.prom")
    fams = families(tmp_path / "tie.prom")
    for i in range(2):
        assert verdicts(fams, UUID=uuid(i)) == {s: float(s == "TIE") for s in STATES}
    assert "coppelius_gpu_first_difference_info" not in fams


def test_cpu_slots_differ_by_index(tmp_path):
    """The interpreter's slots have no UUID or PCI bus id: their series differ by index."""
    kids = _children(tmp_path, set(), n=2, cpu=True)
    rep = node_report(Invocation(profile="tiny", backend="interpret", work=tmp_path, steps=2),
                      kids, judge(kids))
    write(from_report(rep), tmp_path / "cpu.prom")
    fams = families(tmp_path / "cpu.prom")
    for i in range(2):
        assert verdicts(fams, index=str(i), UUID="", pci_bus_id="")["PASS"] == 1.0
    assert of(fams, "coppelius_gpu_run_info", index="0")[0].labels["backend"] == "interpret"


def test_nvml_readings_in_base_units(tmp_path):
    kids = _children(tmp_path, set(), n=1)
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2), kids, judge(kids))
    first = dict.fromkeys(READINGS, 0) | {"temperature_c": 40, "power_w": None,
                                          "sm_clock_mhz": 1410, "memory_clock_mhz": 3201,
                                          "throttle_reasons": 0x8}
    last = dict(first, temperature_c=57, sm_clock_mhz=1980, throttle_reasons=0x4,
                ecc_volatile_uncorrected=2, row_remap_pending=1)
    rep["gpus"][0]["telemetry"] = [dict(phase="start", t_s=0.0, **first),
                                   dict(phase="end", t_s=3.0, **last)]
    write(from_report(rep), tmp_path / "nvml.prom")
    fams = families(tmp_path / "nvml.prom")
    gpu = {"UUID": uuid(0)}
    assert value(fams, "coppelius_gpu_temperature_celsius", **gpu) == 57       # the last sample
    assert value(fams, "coppelius_gpu_sm_clock_hertz", **gpu) == 1980e6
    assert value(fams, "coppelius_gpu_memory_clock_hertz", **gpu) == 3201e6
    assert value(fams, "coppelius_gpu_clock_throttle_reasons", **gpu) == 0xC   # OR over samples
    assert value(fams, "coppelius_gpu_row_remap_pending", **gpu) == 1
    assert value(fams, "coppelius_gpu_power_watts", **gpu) is None             # never read
    ecc = of(fams, "coppelius_gpu_ecc_volatile_uncorrected_errors", **gpu)
    assert [(s.name, s.value) for s in ecc] == [
        ("coppelius_gpu_ecc_volatile_uncorrected_errors_total", 2.0)]
    assert value(fams, "coppelius_gpu_telemetry_samples", **gpu) == 2


def test_every_nvml_reading_has_a_metric():
    assert set(NVML) == set(READINGS)


def test_docs_name_every_series_written(tmp_path):
    """docs/NODE.md's metric table names every series a GPU with every value gets."""
    kids = _children(tmp_path, {1}, n=3)
    v = judge(kids)
    v[1]["kernel"] = dict(KERNEL)
    v[1]["soak"] = {"repetitions": 2, "verdict": "no transient fault", "transient": []}
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2, soak=2), kids, v)
    rep["gpus"][1]["telemetry"] = [dict(phase="end", t_s=0.0, **dict.fromkeys(READINGS, 1))]
    write(from_report(rep), tmp_path / "all.prom")
    written = {s.name for samples in families(tmp_path / "all.prom").values() for s in samples}
    doc = (ROOT / "docs" / "NODE.md").read_text()
    assert len(written) == 20 and not [n for n in written if f"`{n}" not in doc], written


def test_two_gpus_with_the_same_labels_are_refused(tmp_path):
    kids = _children(tmp_path, set(), n=2)
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2), kids, judge(kids))
    rep["gpus"][1].update(index=0, uuid=uuid(0), pci_bus_id=pci(0))
    with pytest.raises(MetricsRefused, match="would be one series") as e:
        write(from_report(rep), tmp_path / "dup.prom")
    assert e.value.hint and not (tmp_path / "dup.prom").exists()


def test_bad_metrics_paths_are_refused_with_a_hint(tmp_path):
    with pytest.raises(MetricsRefused, match="its directory .* does not exist") as e:
        check(tmp_path / "missing" / "x.prom")
    assert "create the directory" in e.value.hint
    with pytest.raises(MetricsRefused, match="is a directory"):
        check(tmp_path)


def test_without_prometheus_client_a_refusal_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)     # import raises ImportError
    with pytest.raises(MetricsRefused, match="prometheus-client, which is not installed") as e:
        check(tmp_path / "x.prom")
    assert "-m pip install 'prometheus-client" in e.value.hint


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 64 KiB tmpfs (mounted by the test, unmounted after), for a disk that
    fills up: the real ENOSPC, not a patched write."""
    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "coppelius-test", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(directory: Path) -> None:
    """Write a filler file until the file system refuses with ENOSPC."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)


def test_a_full_disk_keeps_the_last_complete_file(tmp_path, full_disk):
    kids = _children(tmp_path / "n", set(), n=2)
    rep = node_report(Invocation(profile="tiny", work=tmp_path, steps=2), kids, judge(kids))
    target = full_disk / "coppelius.prom"
    write(from_report(rep)[:1], target)
    before = target.read_bytes()
    fill(full_disk)
    with pytest.raises(MetricsRefused, match=r"cannot write: No space left on device \(ENOSPC\)"):
        write(from_report(rep), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in full_disk.iterdir()) == ["coppelius.prom", "filler"]


# ------------------------------------------------------------------ end to end, the stub driver
@pytest.fixture(scope="module")
def stub() -> Path:
    return stub_driver.built_or_skip()


def coppelius(stub: Path, tmp_path: Path, *args: str, env=None, **settings):
    env = env or stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, **settings)
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def test_node_metrics_say_what_the_report_says(stub, tmp_path):
    """A faulty GPU with digests and a soak: each GPU's series carry the JSON report's verdict,
    first difference, first kernel (where the report names one) and soak."""
    out = tmp_path / "node.prom"
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), "--soak", "2", "--json", "--metrics", str(out),
                  COPPELIUS_STUB_DEVICES=3, COPPELIUS_STUB_FAULTY=1)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    fams = families(out)
    assert [g["verdict"] for g in rep["gpus"]] == ["PASS", "FAIL", "PASS"]
    for g in rep["gpus"]:
        gpu = dict(Hostname=rep["host"], index=str(g["index"]), UUID=STUB_UUID.format(g["index"]),
                   pci_bus_id=g["pci_bus_id"])
        assert verdicts(fams, **gpu) == {s: float(s == g["verdict"]) for s in STATES}
        assert value(fams, "coppelius_gpu_run_duration_seconds", **gpu) == \
            g["process"]["wall_s"]
        assert value(fams, "coppelius_gpu_last_run_timestamp_seconds", **gpu) == \
            pytest.approx(g["process"]["ended_unix_s"])
        gap = value(fams, "coppelius_gpu_host_gap_median_seconds", **gpu)
        assert gap == pytest.approx(_median_gap_s(Path(g["result"])), abs=1e-9)
        assert value(fams, "coppelius_gpu_soak_repetitions", **gpu) == 2
        assert value(fams, "coppelius_gpu_soak_transient_faults", **gpu) == \
            len(g["soak"]["transient"])
        diff = of(fams, "coppelius_gpu_first_difference_info", **gpu)
        kernel = of(fams, "coppelius_gpu_first_divergent_kernel_info", **gpu)
        if g["verdict"] == "PASS":
            assert diff == [] and kernel == []
            continue
        fd = g["first_difference"]
        assert [(s.labels["section"], s.labels["where"]) for s in diff] == [
            (fd["section"], fd["where"])]
        k = g["kernel"] or {}
        assert [(s.labels["launch"], s.labels["kernel"]) for s in kernel] == (
            [(str(k["launch"]), k["kernel"])] if k.get("launch") is not None else [])


def test_node_metrics_with_the_stub_nvml(stub, tmp_path):
    from tests.support import stub_nvml
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the nvml extra) is not installed")
    lib = stub_nvml.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    env = stub_nvml.with_library(stub_driver.env(
        tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, COPPELIUS_STUB_DEVICES=2,
        COPPELIUS_STUB_NVML_ECC=1, COPPELIUS_STUB_NVML_SLOWDOWN=0), lib)
    out = tmp_path / "node.prom"
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), "--telemetry-interval", "0.2", "--metrics", str(out),
                  env=env)
    assert r.returncode == 0, r.stderr
    fams = families(out)
    for k in range(2):       # stub_nvml/README.md: GPU K reads 40 + K °C, 300 + K W, ...
        gpu = {"UUID": STUB_UUID.format(k)}
        assert value(fams, "coppelius_gpu_temperature_celsius", **gpu) == 40 + k
        assert value(fams, "coppelius_gpu_power_watts", **gpu) == 300 + k
        assert value(fams, "coppelius_gpu_sm_clock_hertz", **gpu) == 1980e6
        assert value(fams, "coppelius_gpu_memory_clock_hertz", **gpu) == 3201e6
        assert value(fams, "coppelius_gpu_clock_throttle_reasons", **gpu) == (0x8 if k == 0
                                                                                else 0)
        assert value(fams, "coppelius_gpu_ecc_volatile_uncorrected_errors", **gpu) == k
        assert value(fams, "coppelius_gpu_row_remap_pending", **gpu) == k
        assert value(fams, "coppelius_gpu_telemetry_samples", **gpu) >= 2
        assert verdicts(fams, **gpu)["PASS"] == 1.0


def test_a_bad_metrics_path_never_changes_the_node(stub, tmp_path):
    missing = tmp_path / "missing" / "coppelius.prom"
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), "--metrics", str(missing),
                  COPPELIUS_STUB_DEVICES=2, COPPELIUS_STUB_FAULTY=1)
    assert r.returncode == 1, r.stderr                  # the verdicts' status: a TIE of two
    lines = [x for x in r.stderr.splitlines() if "metrics" in x]
    assert len(lines) == 1 and "does not exist (hint: create the directory" in lines[0], r.stderr
    assert "TIE" in r.stdout and not missing.parent.exists()


def test_a_full_disk_never_changes_the_node(stub, tmp_path, full_disk):
    target = full_disk / "coppelius.prom"
    target.write_text("# the last complete file\n")
    fill(full_disk)
    r = coppelius(stub, tmp_path, "node", "--profile", "tiny", "--steps", "1", "--work",
                  str(tmp_path / "n"), "--metrics", str(target), COPPELIUS_STUB_DEVICES=2)
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stderr.splitlines() if "metrics" in x]
    assert len(line) == 1 and "No space left on device (ENOSPC) (hint: free space" in line[0]
    assert target.read_text() == "# the last complete file\n"
    assert sorted(p.name for p in full_disk.iterdir()) == ["coppelius.prom", "filler"]


def test_metrics_of_result_files_and_their_telemetry(stub, tmp_path):
    """`coppelius metrics` over two GPUs' results (what the node check hands it): the verdicts
    against a known-good file, the identity from the result, NVML from the telemetry file beside
    it, a missing result a FAIL; labels repeated twice are refused."""
    from tests.support import stub_nvml
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the nvml extra) is not installed")
    lib = stub_nvml.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    results = []
    for k in range(2):
        env = stub_nvml.with_library(stub_driver.env(
            tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1, COPPELIUS_STUB_DEVICES=2,
            COPPELIUS_STUB_FAULTY=1), lib)
        (tmp_path / f"w{k}").mkdir()
        results.append(tmp_path / f"gpu{k}.bin")
        r = coppelius(stub, tmp_path, "run", "--profile", "tiny", "--steps", "1", "--quiet",
                      "--device", str(k), "--directory", str(tmp_path / f"w{k}"),
                      "--result", str(results[k]), env=env)
        assert r.returncode == 0, r.stderr
    out = tmp_path / "check.prom"
    r = coppelius(stub, tmp_path, "metrics", "--host", "node7", "--expect", str(results[0]),
                  "--gpu", "0", str(results[0]), "--gpu", "1", str(results[1]),
                  "--gpu", "2", str(tmp_path / "gpu2.bin"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {out}: 3 GPU(s), 1 PASS, 2 FAIL, 0 TIE, 0 ERROR"
    fams = families(out)
    assert verdicts(fams, Hostname="node7", index="0", UUID=STUB_UUID.format(0),
                    pci_bus_id="0000:18:00.0")["PASS"] == 1.0
    assert verdicts(fams, Hostname="node7", index="1", UUID=STUB_UUID.format(1),
                    pci_bus_id="0000:28:00.0")["FAIL"] == 1.0
    assert verdicts(fams, Hostname="node7", index="2", UUID="")["FAIL"] == 1.0    # no result
    assert of(fams, "coppelius_gpu_first_difference_info", index="1")[0].labels["section"]
    assert value(fams, "coppelius_gpu_temperature_celsius", index="1") == 41
    assert value(fams, "coppelius_gpu_host_gap_median_seconds", index="1") == pytest.approx(
        _median_gap_s(results[1]), abs=1e-9)
    assert value(fams, "coppelius_gpu_host_gap_median_seconds", index="2") is None
    assert of(fams, "coppelius_gpu_run_info", index="2") == []       # nothing says what ran
    assert of(fams, "coppelius_gpu_run_info", index="1")[0].labels["profile"] == "tiny"
    again = coppelius(stub, tmp_path, "metrics", "--host", "node7", str(tmp_path / "a.bin"),
                      str(tmp_path / "b.bin"), "-o", str(tmp_path / "dup.prom"))
    assert again.returncode == 2 and "would be one series" in again.stderr
    assert not (tmp_path / "dup.prom").exists()


def test_the_node_checks_exit_ignores_its_metrics(stub, tmp_path):
    """The Slurm node check with COPPELIUS_METRICS in a missing directory: its GPU passes, it
    exits 0 (a Prolog drains no node for its monitoring's sake) and logs why nothing was
    written."""
    from coppelius.slurm import path as script
    env = stub_driver.env(tmp_path / "stub.log", stub, COPPELIUS_STUB_QUIET=1)
    (tmp_path / "good").mkdir()
    expect = tmp_path / "good.bin"
    good = coppelius(stub, tmp_path, "run", "--profile", "tiny", "--steps", "1", "--quiet",
                     "--directory", str(tmp_path / "good"), "--result", str(expect), env=env)
    assert good.returncode == 0, good.stderr
    missing = tmp_path / "missing" / "coppelius.prom"
    check = subprocess.run(
        ["bash", str(script("node-check"))], capture_output=True, text=True, timeout=TIMEOUT_S,
        env=dict(env, COPPELIUS_EXPECT=str(expect), COPPELIUS=f"{sys.executable} -m coppelius.cli",
                 COPPELIUS_ARGS="--profile tiny --steps 1", COPPELIUS_GPUS="0",
                 COPPELIUS_METRICS=str(missing), SLURMD_NODENAME="n9",
                 COPPELIUS_NODE_CHECK_CONF="/nonexistent"))
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert lines[0] == "coppelius-node-check: node n9 GPU 0 PASS", lines
    assert lines[1].startswith("coppelius-node-check: node n9 metrics not written (the verdicts "
                               "stand): coppelius metrics: metrics file"), lines
    assert "does not exist (hint: create the directory" in lines[1] and len(lines) == 2
    assert not missing.parent.exists()
