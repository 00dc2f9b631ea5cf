"""The cuda backend's logic on the CPU, through a fake driver (tests/fake_driver.py).

What a GPU would run is not checked here (see tests/test_cuda_backend.py on a GPU); what the host
does is: every launch resolves its arguments to the right device addresses with the committed
manifest's parameter list, graphs hold the launch lists in order, the transfer window moves the
payload, releases reach the mapped semaphores, and a device fault ends a run with its tail written.
"""
import ctypes

import numpy as np
import pytest

from host import driver as drv
from host import ptx
from plan import launches, profiles
from staging import layout as L
from staging import records as R

from fake_driver import DEVICE_ALIAS, CUresult, FakeDriver

TINY = profiles.get("tiny")

pytestmark = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


@pytest.fixture
def fake(monkeypatch):
    def make(cc=(9, 0), **kw):
        f = FakeDriver(cc=cc, **kw)
        monkeypatch.setattr(drv, "_cu", f)
        return f
    return make


def decode(params_addr: int, types: list[str]) -> list:
    ptrs = (ctypes.c_void_p * len(types)).from_address(params_addr)
    out = []
    for p, t in zip(ptrs, types):
        ct = drv.Kernel.CTYPES[t]
        out.append(ct.from_address(p).value)
    return out


@pytest.mark.parametrize("cc,target", [((9, 0), "sm_90a"), ((8, 6), "sm_80")])
def test_every_launch_resolves_to_the_right_addresses(fake, cc, target):
    from host.backend_cuda import CudaBackend
    f = fake(cc)
    with CudaBackend(TINY) as b:
        assert b.device().target == target
        t_base = 41
        b.instantiate(t_base)
        subs = launches.submissions(TINY)
        assert len(f.graphs) == 3
        log = iter(f.launch_log)
        for sub in subs:
            assert sub.launches[0].function == launches.STAGE_IN
            assert sub.launches[-1].function == launches.RELEASE
            for launch in sub.launches:
                fn, grid, block, shared, addr = next(log)
                entry = b.manifest.entries[launch.kernel]
                assert fn == entry.entry
                assert grid == launch.grid and block == (entry.threads, 1, 1)
                assert shared == entry.shared
                got = decode(addr, list(entry.param_types))
                for (name, arg), value in zip(launch.args, got):
                    if isinstance(arg, launches.BufferRef):
                        want = b.buffers[arg.buffer].ptr + arg.byte_offset
                    elif isinstance(arg, launches.StagingRef):
                        want = b.region.host_ptr + DEVICE_ALIAS + arg.offset
                    elif isinstance(arg, launches.RunScalar):
                        want = t_base
                    else:
                        want = arg.value
                    if isinstance(want, float):
                        assert value == pytest.approx(want, rel=1e-7), (launch.kernel, name)
                    else:
                        assert value == want, (launch.kernel, name)
                assert len(got) == len(launch.args) + len(entry.hidden)
        assert next(log, None) is None


def test_manifest_parameters_match_the_launch_lists():
    """Each entry's parameter list = its launch's arguments (same order and kinds) + hidden."""
    for target in ("sm_90a", "sm_80"):
        for pname in profiles.names():
            m = ptx.Manifest.load(pname, target)
            assert not m.verify(), m.verify()
            for sub in launches.submissions(profiles.get(pname)):
                for launch in sub.launches:
                    e = m.entries[launch.kernel]
                    kinds = ["ptr" if isinstance(a, (launches.BufferRef, launches.StagingRef))
                             else drv.Kernel.CTYPES and {"i32": "i32", "i64": "i64",
                                                         "fp32": "f32"}[a.type]
                             for _, a in launch.args]
                    assert list(e.param_types[:len(kinds)]) == kinds, launch.kernel
                    assert all(t == "ptr" for t in e.param_types[len(kinds):]), launch.kernel


def test_payload_moves_through_the_transfer_window(fake):
    from host.backend_cuda import CudaBackend
    fake()
    with CudaBackend(TINY) as b:
        rng = np.random.default_rng(3)
        payload = rng.integers(0, 256, TINY.payload_bytes, dtype=np.uint8)
        for off in range(0, TINY.payload_bytes, L.TRANSFER_WINDOW_BYTES):
            n = min(L.TRANSFER_WINDOW_BYTES, TINY.payload_bytes - off)
            b.staging.transfer[:n] = payload[off:off + n]
            b.upload_chunk(off, n)
        pmv = (ctypes.c_uint8 * TINY.payload_bytes).from_address(b.buffers["pmv"].ptr)
        assert np.array_equal(np.frombuffer(pmv, np.uint8), payload)
        b.staging.transfer[:] = 0
        off = TINY.payload_bytes - 1000          # the last, partial chunk
        b.download_chunk(off, 1000)
        assert np.array_equal(b.staging.transfer[:1000], payload[off:])
        with pytest.raises(ValueError, match="outside the payload"):
            b.upload_chunk(off, 1001)


def test_staging_is_poisoned_and_releases_reach_the_mapped_semaphores(fake):
    from host.backend_cuda import CudaBackend
    from host.ring import Ring
    fake()
    with CudaBackend(TINY) as b:
        assert (b.staging.raw == L.POISON_BYTE).all()
        b.instantiate(-1)
        ring = Ring(b, capacity=3)
        for sub in (L.SUBMISSION_FORWARD, L.SUBMISSION_UPDATE, L.SUBMISSION_FINAL):
            ring.run(sub, context=0, step=None)
        slots = b.staging.semaphores
        assert list(slots["final_payload"]) == [1, 2, 3]
        assert list(slots["prelaunch_payload"]) == [1, 2, 3]
        t = ring.entries()
        assert (t["flags"] == R.FLAG_FENCE_OBSERVED).all()
        assert (t["device_final_ns"] >= t["device_prelaunch_ns"]).all()
        assert ring.gp_get == ring.gp_put == 3


def test_a_device_fault_ends_the_run_with_its_tail(fake, tmp_path):
    """The driver reports an illegal address while the host waits: outcome device error, notifier
    filled with the CUresult, the result file still complete and readable."""
    from host.result_file import read
    from host.run import Request, run
    fake(fail_graph_launch=CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    (tmp_path / "c.ckpt").write_bytes(b"")
    summary = run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt",
                          result=tmp_path / "r.bin", backend="cuda", directory=tmp_path / "run",
                          fence_timeout_s=5))
    assert summary.outcome == R.OUTCOME_DEVICE_ERROR and summary.exit_code == 1
    rf = read(tmp_path / "r.bin")
    assert int(rf.status["outcome"]) == R.OUTCOME_DEVICE_ERROR
    assert int(rf.status["steps_completed"]) == 0
    n = rf.error_notifier
    assert int(n["info32"]) == int(CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)
    assert int(n["status"]) == R.NOTIFIER_STATUS_ERROR
    assert bytes(n["reason"]).startswith(b"CUDA_ERROR_ILLEGAL_ADDRESS")
    assert int(n["sequence"]) == 1 and int(n["info16"]) == L.SUBMISSION_FORWARD
    assert int(rf.timestamps[0]["flags"]) & R.FLAG_ERROR
    assert (tmp_path / "c.ckpt").stat().st_size == 0        # nothing was published


def test_a_surviving_marker_is_a_device_fault(fake, tmp_path):
    """The fake device runs only the releases: the forward record keeps its marker, which the host
    must treat as a device fault (SPEC §6), not as logits."""
    from host.result_file import read
    from host.run import Request, run
    fake()
    (tmp_path / "c.ckpt").write_bytes(b"")
    summary = run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt",
                          result=tmp_path / "r.bin", backend="cuda", directory=tmp_path / "run"))
    assert summary.outcome == R.OUTCOME_DEVICE_ERROR
    rf = read(tmp_path / "r.bin")
    assert int(rf.error_notifier["info32"]) == R.INFO_MARKER_SURVIVED
    assert np.asarray(rf.forward).tobytes()[:8] == L.RECORD_MARKER


def test_host_buffer_is_zero_copy_with_and_without_cffi(monkeypatch):
    import builtins
    backing = ctypes.create_string_buffer(64)
    addr = ctypes.addressof(backing)
    for blocked in (False, True):
        if blocked:
            real_import = builtins.__import__
            monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
                (_ for _ in ()).throw(ImportError(name)) if name == "cffi" else real_import(name, *a, **k)))
        view = np.frombuffer(drv.host_buffer(addr, 64), np.uint8)
        view[-1] = 7 + blocked
        assert backing.raw[-1] == 7 + blocked
