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
            assert sub.launches[0].function == launches.RELEASE
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
        b.upload_payload(payload)
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


# ---- manifests: exactly the build tool's schema, each PTX file checked against its digest ----

def _manifest_copy(tmp_path, edit=None):
    import json
    import shutil
    src = ptx.ROOT / "tiny" / "sm_80"
    dst = tmp_path / "tiny" / "sm_80"
    shutil.copytree(src, dst)
    if edit is not None:
        data = json.loads((dst / ptx.MANIFEST).read_text())
        edit(data, dst)
        (dst / ptx.MANIFEST).write_text(json.dumps(data))
    return dst


def test_a_ptx_file_that_differs_from_its_digest_is_refused_at_load(fake, tmp_path):
    _manifest_copy(tmp_path)
    m = ptx.Manifest.load("tiny", "sm_80", root=tmp_path)
    victim = next(e for e in m.entries.values() if e.entry != launches.RELEASE)
    text = victim.file.read_bytes()
    victim.file.write_bytes(text[:-2] + b" \n")                # one byte changed, at the end
    assert any(victim.key in p and "digest" in p for p in m.verify())
    fake((8, 6))
    with pytest.raises(ptx.PtxAltered, match=victim.file.name):
        m.kernels([])


@pytest.mark.parametrize("key", ["sha256", "threads", "shared", "entry"])
def test_a_manifest_entry_without_a_written_key_is_refused_naming_it(tmp_path, key):
    first = {}

    def drop(data, _):
        name = sorted(data["kernels"])[0]
        first["name"] = name
        del data["kernels"][name][key]
    _manifest_copy(tmp_path, drop)
    with pytest.raises(ptx.PtxMissing, match=f"{first['name']}: no '{key}'"):
        ptx.Manifest.load("tiny", "sm_80", root=tmp_path)


def test_no_alternate_keys_the_build_tool_never_writes(tmp_path):
    """`threads_per_block` / `symbol` / `entries` were read once; nobody writes them."""
    def rename(data, _):
        for rec in data["kernels"].values():
            rec["threads_per_block"] = rec.pop("threads")
    _manifest_copy(tmp_path, rename)
    with pytest.raises(ptx.PtxMissing, match="no 'threads'"):
        ptx.Manifest.load("tiny", "sm_80", root=tmp_path)


def test_kernels_receive_their_scratch_sizes_from_the_manifest(fake):
    from host.backend_cuda import CudaBackend
    fake()
    with CudaBackend(TINY) as b:
        for key, k in b.kernels.items():
            e = b.manifest.entries[key]
            assert k.scratch == e.scratch and len(k.scratch) == len(e.hidden)


# ---- close paths: through check(), a failure reported, never raised ----

def test_a_failing_free_is_reported_not_raised(fake):
    from host.backend_cuda import CudaBackend
    f = fake()
    b = CudaBackend(TINY)
    f.cuMemFree = lambda ptr: (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    with pytest.warns(drv.ReleaseWarning, match="CUDA_ERROR_ILLEGAL_ADDRESS from cuMemFree"):
        b.close()
    assert b._closers == []


def test_driver_errors_are_named_from_one_table(fake):
    from host.cmd_inspect import info_name
    fake()
    assert drv.error_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert drv.error_name(123456) == "CUresult 123456"
    assert info_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert info_name(R.INFO_FENCE_TIMEOUT) != "CUresult 65537"


# ---- doctor drives the backend a run uses ----

def test_doctor_opens_the_cuda_backend_and_smoke_launches(fake, capsys):
    import argparse
    import json

    from host import cmd_doctor
    fake()
    rc = cmd_doctor.run(argparse.Namespace(profile="tiny", json=True))
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    names = [c["name"] for c in report["checks"]]
    for want in ("driver", "device", "PTX target", "staging", "backend open", "smoke launch"):
        assert want in names
    smoke = next(c for c in report["checks"] if c["name"] == "smoke launch")
    assert "0x5eed" in smoke["value"] and smoke["ok"]
