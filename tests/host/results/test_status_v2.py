"""Status block version 2 (FORMATS §4): the GPU's UUID, PCI bus id and the host name in the same
160 bytes; the reader gives either version as one record; diff counts the identity and the version
as environment fields; a version-1 file (a run's result kept from before version 2) still reads."""
from __future__ import annotations

import socket
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from coppelius.driver.device import GpuIdentity
from coppelius.forensics.diff import compare
from coppelius.plan import profiles as P
from coppelius.results import reader as RF
from coppelius.run import records as RR
from coppelius.staging import records as R
from tests.support.paths import ROOT
from tests.support.result_synth import synthesize

GOLDEN = ROOT / "tests" / "golden" / "tiny-result-c0.bin"
# The tiny golden as a run wrote it before status block version 2 (and before the fused
# attention forward moved a few of its bits): real version-1 bytes, never rewritten.
GOLDEN_V1 = ROOT / "tests" / "golden" / "tiny-result-c0-status-v1.bin"
GPU = GpuIdentity(3, "NVIDIA H200", bytes(range(0xA0, 0xB0)), "0000:9a:00.0")


def as_v2(v1_block: bytes, host: bytes = b"node-017", gpu: GpuIdentity | None = GPU) -> bytes:
    """The version-2 block a run writes for the same run as a version-1 block."""
    st = R.STATUS_BLOCK.unpack(v1_block)
    preds = np.asarray(st["predictions"], np.uint32)
    domain, bus, dev, fn = gpu.pci_fields if gpu else (0, 0, 0, 0)
    flags = (R.IDENTITY_GPU if gpu else 0) | \
        (R.IDENTITY_HOST_TRUNCATED if len(host) > R.HOST_NAME_BYTES else 0)
    keep = {k: st[k] for k in ("magic", "outcome", "c0", "steps_planned", "steps_completed",
                               "gp_get", "gp_put", "publications", "backend", "wall_ns",
                               "compute_capability", "driver_version", "device_name")}
    return R.STATUS_BLOCK_V2.pack(
        **keep, version=2, predictions=preds[:, 0] | (preds[:, 1] << 31),
        checkpoint_sha256=st["checkpoint_sha256"][:R.DIGEST_PREFIX_BYTES],
        gpu_uuid=np.frombuffer(gpu.uuid if gpu else bytes(16), np.uint8),
        pci_domain=domain, pci_bus=bus, pci_device=dev, pci_function=fn, identity_flags=flags,
        host_name=host[:R.HOST_NAME_BYTES])


def test_v2_layout_keeps_the_locating_fields_in_place():
    for name in ("magic", "version", "outcome", "c0", "steps_planned", "steps_completed",
                 "gp_get", "gp_put", "publications", "backend", "wall_ns", "device_name"):
        assert R.STATUS_BLOCK_V2.offset(name) == R.STATUS_BLOCK.offset(name), name
    assert R.STATUS_BLOCK_V2.itemsize == R.STATUS_BLOCK.itemsize == 160


def test_a_v2_file_reads_as_the_same_run_with_its_identity(tmp_path):
    syn = synthesize(P.get("tiny"), steps=3)
    v1, v2 = tmp_path / "v1.bin", tmp_path / "v2.bin"
    syn.write(v1)
    replace(syn, status=as_v2(syn.status)).write(v2)
    a, b = RF.read(v1), RF.read(v2)
    assert (a.status_version, b.status_version) == (1, 2)
    for name in R.STATUS_BLOCK.fields:
        if name not in ("checkpoint_sha256", "version"):
            assert np.array_equal(a.status[name], b.status[name]), name
    assert b.checkpoint_digest() == a.checkpoint_digest()[:2 * R.DIGEST_PREFIX_BYTES]
    assert a.gpu_identity() == {"host_name": "", "gpu_uuid": "", "pci_bus_id": ""}
    assert b.gpu_identity() == {"host_name": "node-017", "pci_bus_id": "0000:9a:00.0",
                                "gpu_uuid": "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"}
    rep = compare(a, b)
    assert rep["same"] and rep["verdict"].startswith("identical except")
    env = set(rep["environment_fields"])
    assert {"status.version", "status.gpu_uuid", "status.host_name"} <= env


def test_identity_never_makes_two_v2_files_differ_but_numbers_do(tmp_path):
    syn = synthesize(P.get("tiny"), steps=2)
    paths = [tmp_path / f"{k}.bin" for k in range(3)]
    replace(syn, status=as_v2(syn.status, b"a")).write(paths[0])
    other = GpuIdentity(0, "NVIDIA H200", bytes(16 * [7]), "0001:18:1f.3")
    replace(syn, status=as_v2(syn.status, b"b" * 40, other)).write(paths[1])
    w = syn.windows.copy()
    w[1, 5] = np.float32(1.5)
    replace(syn, windows=w, status=as_v2(syn.status, b"c")).write(paths[2])
    a, b, c = (RF.read(p) for p in paths)
    assert compare(a, b)["same"]
    assert b.gpu_identity()["host_name"] == "b" * R.HOST_NAME_BYTES + "…"
    assert b.gpu_identity()["pci_bus_id"] == "0001:18:1f.3"
    rep = compare(a, c)
    assert not rep["same"] and rep["first"]["section"] == "steps"


def test_the_v1_golden_still_reads():
    rf = RF.read(GOLDEN_V1)
    assert rf.status_version == 1 and rf.outcome == "completed"
    assert int(rf.status["update_count"]) == rf.steps
    assert len(rf.checkpoint_digest()) == 64 and rf.gpu_identity()["gpu_uuid"] == ""


def test_the_current_golden_is_v2_and_diff_reads_the_two_versions_side_by_side():
    new, old = RF.read(GOLDEN), RF.read(GOLDEN_V1)
    assert new.status_version == R.STATUS_VERSION == 2
    assert (new.steps, int(new.status["c0"])) == (old.steps, int(old.status["c0"]))
    rep = compare(old, new)
    assert "status.version" in rep["environment_fields"]


def test_the_run_writes_v2_with_gpu_and_host():
    views = SimpleNamespace(predictions=np.array([[5, 1], [6, 0], [7, 1]], np.uint32))
    dev = SimpleNamespace(compute_capability=90, driver_version=13000, name="NVIDIA H200")
    backend = SimpleNamespace(device=lambda: dev, gpu_identity=lambda: GPU, code=R.BACKEND_CUDA)
    summary = RR.Summary(c0=4, steps_planned=2, steps_completed=2, publications=1, wall_s=1.5)
    ring = SimpleNamespace(gp_get=4, gp_put=4)
    block = RR.status_block(summary, ring, backend, views, bytes(range(32)))
    st = RF.status_fields(block)
    assert int(st["version"]) == R.STATUS_VERSION == 2
    assert np.asarray(st["predictions"]).tolist() == [[5, 1], [6, 0], [7, 1]]
    assert int(st["update_count"]) == 6
    assert RF.run_identity(st) == {
        "host_name": socket.gethostname()[:R.HOST_NAME_BYTES]
        + ("…" if len(socket.gethostname()) > R.HOST_NAME_BYTES else ""),
        "gpu_uuid": GPU.uuid_text, "pci_bus_id": "0000:9a:00.0"}
    no_gpu = SimpleNamespace(device=lambda: dev, gpu_identity=lambda: None, code=2)
    st = RF.status_fields(RR.status_block(summary, ring, no_gpu, views, bytes(32)))
    assert RF.run_identity(st)["gpu_uuid"] == "" and RF.run_identity(st)["pci_bus_id"] == ""


def test_diff_shows_where_each_file_ran_per_file_and_per_class(tmp_path, capsys):
    from coppelius.cli import main
    syn = synthesize(P.get("tiny"), steps=2)
    a, b, c = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin"
    replace(syn, status=as_v2(syn.status, b"node-a")).write(a)
    syn.write(b)                                            # version 1: no identity
    w = syn.windows.copy()
    w[0, 0] = np.float32(9.0)
    replace(syn, windows=w, status=as_v2(syn.status, b"node-c")).write(c)
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"A: {a} (tiny, completed, 2 steps" in out
    assert f"on node-a, {GPU.uuid_text} (PCI 0000:9a:00.0)" in out
    assert "status.version" in out and "status.host_name" in out     # environment, apart
    assert main(["diff", str(a), str(b), str(c)]) == 1
    out = capsys.readouterr().out
    assert f"class 2: {c} on node-c, {GPU.uuid_text} (PCI 0000:9a:00.0)" in out
    assert f"{b}," in out or f"{b}\n" in out
