"""The cuda backend: target choice and import hygiene on the CPU; the real driver path on a GPU.

GPU tests carry the `gpu` mark and skip cleanly where no driver or device exists.
"""
import subprocess
import sys

import numpy as np
import pytest
from tests.support.backend_support import download_payload

from coppelius.errors import BackendUnavailable
from coppelius.backends.cuda.backend import choose_target
from coppelius.plan import profiles
from coppelius.staging import layout as L


def _gpu_available() -> bool:
    try:
        from coppelius.driver.calls import Device
        Device().close()
        return True
    except Exception:
        return False


GPU = _gpu_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no NVIDIA GPU / driver on this machine")


@pytest.mark.parametrize("cc,target", [(90, "sm_90a"), (80, "sm_80"), (86, "sm_80"), (89, "sm_80"),
                                       (100, "sm_80"), (120, "sm_80")])
def test_target_by_compute_capability(cc, target):
    assert choose_target(cc) == target


@pytest.mark.parametrize("cc", [75, 70, 61])
def test_old_devices_are_refused(cc):
    with pytest.raises(BackendUnavailable, match="older than 8.0"):
        choose_target(cc)


def test_cuda_path_imports_no_triton_or_torch():
    code = ("import sys, coppelius.backends.cuda.backend, coppelius.run.loop, coppelius.cli, coppelius.cli.doctor, coppelius.backends.cuda.ptx;"
            "bad=[m for m in ('triton','torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_gpu_is_a_clean_refusal():
    if GPU:
        pytest.skip("a GPU is present")
    from coppelius.backends.cuda.backend import CudaBackend
    with pytest.raises(BackendUnavailable, match="interpret"):
        CudaBackend(profiles.get("tiny"))


def test_doctor_without_gpu_exits_nonzero_without_traceback():
    if GPU:
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "doctor", "--profile", "tiny"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "no GPU here" in r.stdout and "Traceback" not in r.stderr


# ---- on a GPU ----

@pytest.mark.gpu
@needs_gpu
def test_mapped_staging_and_release_kernel():
    """The release kernel stores the doorbell's value with a device timestamp into mapped memory."""
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.plan import launches
    with CudaBackend(profiles.get("tiny")) as b:
        v = b.staging
        assert (v.raw[L.INPUTS:L.INPUTS + 64] == L.POISON_BYTE).all()
        key = next(k for k, e in b.manifest.entries.items() if e.entry == launches.RELEASE)
        k = b.kernels[key]
        v.doorbell[0] = 0xABCDEF
        slot = L.semaphore_slot(2) + L.SLOT_PRELAUNCH_RELEASE
        k.launch(b.dev.stream, (1, 1, 1), k.pack([b.region.device_ptr + L.DOORBELL,
                                                   b.region.device_ptr + slot]
                                                  + [0] * (len(k.param_types) - 2)))
        b.synchronize()
        rec = v.semaphores[2]
        assert rec["prelaunch_payload"] == 0xABCDEF and rec["prelaunch_zero"] == 0
        assert rec["prelaunch_timestamp"] > 0


@pytest.mark.gpu
@needs_gpu
def test_payload_round_trip_through_the_transfer_window():
    from coppelius.backends.cuda.backend import CudaBackend
    p = profiles.get("tiny")
    with CudaBackend(p) as b:
        rng = np.random.default_rng(1)
        payload = rng.integers(0, 256, p.payload_bytes, dtype=np.uint8)
        b.upload_payload(payload)
        b.staging.transfer[:] = 0
        back = download_payload(b)
        assert np.array_equal(payload, back)


@pytest.mark.gpu
@needs_gpu
def test_tiny_run_on_cuda_twice_is_bit_identical_and_verifies(tmp_path):
    def run(d):
        d.mkdir()
        (d / "c.ckpt").write_bytes(b"")
        return subprocess.run([sys.executable, "-m", "coppelius.cli", "run", "--profile", "tiny",
                               "--backend", "cuda", "--quiet", "--directory", d / "run",
                               "--checkpoint", d / "c.ckpt", "--result", d / "r.bin"],
                              capture_output=True, text=True)
    for name in ("a", "b"):
        r = run(tmp_path / name)
        assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "diff", tmp_path / "a" / "r.bin",
                        tmp_path / "b" / "r.bin"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert (tmp_path / "a" / "c.ckpt").read_bytes() == (tmp_path / "b" / "c.ckpt").read_bytes()
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "verify", tmp_path / "a" / "r.bin",
                        "--steps", "4", "--directory", tmp_path / "a" / "run"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def _train_on_cuda(profile, steps: int, pdl: bool, directory) -> tuple[np.ndarray, list]:
    """`steps` updates from the fresh initialization through the ring, as a run issues them;
    returns the payload bytes and each step's loss record."""
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.run.ring import Ring
    from coppelius.plan import reference
    from coppelius.staging import synthetic
    from coppelius.staging.tokens import TokenCache
    cache = TokenCache.open(synthetic.ensure_default_stream(profile, directory), profile)
    with CudaBackend(profile, pdl=pdl) as b:
        b.upload_payload(reference.init_parameters(profile).view(np.uint8))
        b.instantiate(t_base=-1)
        if pdl:
            assert b.programmatic_edges[L.SUBMISSION_UPDATE] > 0, "no programmatic edge captured"
        else:
            assert not any(b.programmatic_edges.values())
        ring = Ring(b, capacity=steps + 1)          # one timestamp entry per issue
        cache.write_input_record(b.staging, 0)
        ring.run(L.SUBMISSION_FORWARD, 0, None)
        losses = []
        for s in range(steps):
            cache.write_input_record(b.staging, s)
            ring.run(L.SUBMISSION_UPDATE, s, s)
            losses.append(b.staging.loss_record.copy())
        return download_payload(b), losses


@pytest.mark.gpu
@needs_gpu
def test_programmatic_edges_change_no_bit(tmp_path):
    """Programmatic dependent launch: three tiny updates with the plan's programmatic
    edges and three with every edge full leave the same payload and losses bit for bit — a kernel
    that touched memory before its griddepcontrol.wait would race its predecessor here."""
    p = profiles.get("tiny")
    fast, fast_losses = _train_on_cuda(p, 3, True, tmp_path)
    full, full_losses = _train_on_cuda(p, 3, False, tmp_path)
    assert np.array_equal(fast, full), f"{np.count_nonzero(fast != full)} payload bytes differ"
    for s, (a, b) in enumerate(zip(fast_losses, full_losses)):
        assert np.array_equal(a, b), f"step {s}: loss records differ"
