"""The cuda backend's logic on the CPU, through a fake driver (tools/fake_driver.py).

What a GPU would run is not checked here (see tests/host/backends/test_cuda_backend.py on a GPU); what the host
does is: every launch resolves its arguments to the right device addresses with the committed
manifest's parameter list, graphs hold the launch lists in order, the transfer window moves the
payload, releases reach the mapped semaphores, and a device fault ends a run with its tail written.
"""
import ctypes

import numpy as np
import pytest

from coppelius.driver import calls as drv
from coppelius.driver.device import Device, host_buffer
from coppelius.driver.module import FunctionAttributes, Kernel, PtxRefused
from coppelius.driver.stream import Event, Graph, Stream
from coppelius.backends.cuda import ptx
from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import launches
from coppelius.plan import profiles
from coppelius.staging import layout as L
from coppelius.staging import records as R

from tests.support.fake_driver_fixture import fake  # noqa: F401  (the fixture)
from tools.fake_driver import DEVICE_ALIAS, CUresult
from tests.support.paths import ROOT

TINY = profiles.get("tiny")

pytestmark = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


def decode(params_addr: int, types: list[str]) -> list:
    ptrs = (ctypes.c_void_p * len(types)).from_address(params_addr)
    out = []
    for p, t in zip(ptrs, types):
        ct = Kernel.CTYPES[t]
        out.append(ct.from_address(p).value)
    return out


@pytest.mark.parametrize("cc,target", [((9, 0), "sm_90a"), ((8, 6), "sm_80")])
def test_every_launch_resolves_to_the_right_addresses(fake, cc, target):
    from coppelius.backends.cuda.backend import CudaBackend
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
                             else Kernel.CTYPES and {"i32": "i32", "i64": "i64",
                                                         "fp32": "f32"}[a.type]
                             for _, a in launch.args]
                    assert list(e.param_types[:len(kinds)]) == kinds, launch.kernel
                    assert all(t == "ptr" for t in e.param_types[len(kinds):]), launch.kernel


def test_payload_moves_through_the_transfer_window(fake):
    from coppelius.backends.cuda.backend import CudaBackend
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
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.run.ring import Ring
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
    from coppelius.results.reader import read
    from coppelius.run.loop import Request, run
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
    must treat as a device fault (CONTRACT §6), not as logits."""
    from coppelius.results.reader import read
    from coppelius.run.loop import Request, run
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
        view = np.frombuffer(host_buffer(addr, 64), np.uint8)
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
    from coppelius.backends.cuda.backend import CudaBackend
    fake()
    with CudaBackend(TINY) as b:
        for key, k in b.kernels.items():
            e = b.manifest.entries[key]
            assert k.scratch == e.scratch and len(k.scratch) == len(e.hidden)


# ---- close paths: through check(), a failure reported, never raised ----

def test_a_failing_free_is_reported_not_raised(fake):
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake()
    b = CudaBackend(TINY)
    f.cuMemFree = lambda ptr: (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    with pytest.warns(drv.ReleaseWarning, match="CUDA_ERROR_ILLEGAL_ADDRESS from cuMemFree"):
        b.close()
    assert b.closers.items == []


def test_driver_errors_are_named_from_one_table(fake):
    from coppelius.forensics.summary import info_name
    fake()
    assert drv.error_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert drv.error_name(123456) == "CUresult 123456"
    assert info_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert info_name(R.INFO_FENCE_TIMEOUT) != "CUresult 65537"


# ---- doctor drives the backend a run uses ----

def test_doctor_opens_the_cuda_backend_and_smoke_launches(fake, capsys):
    import argparse
    import json

    from coppelius.cli import doctor as cmd_doctor
    fake()
    rc = cmd_doctor.run(argparse.Namespace(profile="tiny", json=True, device=0))
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    names = [c["name"] for c in report["checks"]]
    for want in ("driver", "device", "PTX target", "staging", "backend open", "smoke launch"):
        assert want in names
    smoke = next(c for c in report["checks"] if c["name"] == "smoke launch")
    assert "0x5eed" in smoke["value"] and smoke["ok"]
    graphs = next(c for c in report["checks"] if c["name"] == "graphs")
    edges = sum(launch_graph.programmatic(s.launches).count(True) for s in launches.submissions(TINY))
    assert graphs["ok"] and f"3 captured, {edges} launches programmatic" in graphs["value"]


def test_doctor_reports_a_refusal_of_programmatic_edges(fake, capsys):
    import argparse
    import json

    from coppelius.cli import doctor as cmd_doctor
    fake(refuse_programmatic=CUresult.CUDA_ERROR_INVALID_VALUE)
    rc = cmd_doctor.run(argparse.Namespace(profile="tiny", json=True, device=0))
    report = json.loads(capsys.readouterr().out)
    graphs = next(c for c in report["checks"] if c["name"] == "graphs")
    assert rc != 0 and not graphs["ok"]
    assert "every edge full" in graphs["value"] and "cuLaunchKernelEx" in graphs["value"]


# ---- first contact: JIT logs, device limits, bindings, safe teardown ----

COPPELIUS = profiles.get("coppelius")


def test_a_ptx_the_driver_refuses_names_the_file_and_quotes_the_jit_log(fake):
    from coppelius.backends.cuda.backend import CudaBackend
    log = ("ptxas application ptx input, line 42; error   : Feature 'wgmma.mma_async' requires "
           ".target sm_90a\nptxas fatal   : Ptx assembly aborted due to errors")
    f = fake((8, 6), jit_errors={"cast_bf16": log})
    with pytest.raises(PtxRefused) as err:
        CudaBackend(TINY)
    msg = str(err.value)
    file = ptx.Manifest.load("tiny", "sm_80").entries
    cast = next(e for e in file.values() if e.entry == "cast_bf16")
    assert f"kernels_ptx/tiny/sm_80/{cast.file.name}" in msg
    assert "CUDA_ERROR_INVALID_PTX" in msg and "line 42" in msg and "Ptx assembly aborted" in msg
    assert err.value.log == log
    assert not f.allocations and not f.host          # refused before any allocation


def test_shared_memory_beyond_the_opt_in_limit_is_refused_naming_kernel_need_and_limit(fake):
    """A device whose opt-in limit is one allocation unit below the largest sm_80 need refuses
    that kernel by name, with need and limit, before any work."""
    from coppelius.backends.cuda.backend import CudaBackend, KernelRefused
    entries = ptx.Manifest.load("coppelius", "sm_80").entries
    top = max(entries, key=lambda k: entries[k].shared)
    need = entries[top].shared
    f = fake((8, 6), shared_optin=need - 128)
    with pytest.raises(KernelRefused) as err:
        CudaBackend(COPPELIUS)
    msg = str(err.value)
    assert f"{top} needs {need:,} B of shared memory per block, the limit is {need - 128:,} B" in msg
    assert "compute capability 8.6" in msg and "A100" in err.value.hint
    assert not f.allocations and not f.host and not f.shared_opt_ins   # before any work


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (12, 0)])
def test_every_sm80_gpu_fits_every_sm80_kernel_and_opts_in_their_shared_memory(fake, cc):
    """The largest sm_80 need (98,304 B since the SwiGLU forward's 128×64 tiles on bf16 rows)
    fits an A100's 166,912 B and the 101,376 B of cc 8.6/8.9/12.0 (README: which GPUs run)."""
    from coppelius.backends.cuda.backend import refuse_unfit
    f = fake(cc)
    dev = Device()
    closers = [dev]
    kernels = ptx.Manifest.load("coppelius", "sm_80").kernels(closers)
    refuse_unfit(kernels, dev)                       # no refusal
    for k in kernels.values():
        k.opt_in_shared()
    assert max(f.shared_opt_ins.values()) == max(k.shared for k in
                                                 ptx.Manifest.load("coppelius", "sm_80").entries.values())
    assert max(f.shared_opt_ins.values()) <= 101376
    for c in reversed(closers):
        c.close()


def test_a_static_shared_need_counts_against_the_limit(fake):
    from coppelius.backends.cuda.backend import CudaBackend, KernelRefused
    tiny_max = max(e.shared for e in ptx.Manifest.load("tiny", "sm_80").entries.values())
    f = fake((8, 6), functions={"cast_bf16": {"static_shared": 101376 + 1}})   # no dynamic shared
    with pytest.raises(KernelRefused, match="cast_bf16_[0-9a-f]+ needs 101,377 B"):
        CudaBackend(TINY)
    assert tiny_max <= 101376 and not f.allocations


def test_more_threads_than_the_function_allows_is_refused(fake):
    from coppelius.backends.cuda.backend import CudaBackend, KernelRefused
    fake(functions={"cast_bf16": {"max_threads": 128, "regs": 255}})
    with pytest.raises(KernelRefused, match="cast_bf16_[0-9a-f]+ launches 256 threads per block, "
                                            "the driver allows 128 at its 255 registers"):
        CudaBackend(TINY)


def test_every_function_is_loaded_with_its_attributes_at_start(fake):
    from coppelius.backends.cuda.backend import CudaBackend
    fake(functions={"cast_bf16": {"regs": 77, "local": 16, "spill": 8}})
    with CudaBackend(TINY) as b:
        assert set(b.kernels) == set(b.manifest.entries)
        cast = next(k for k in b.kernels.values() if k.function == "cast_bf16")
        assert cast.attributes == FunctionAttributes(registers=77, local_bytes=16,
                                                         static_shared=0, max_threads=1024)
        assert cast.spills == (8, 8)


def test_doctor_reports_each_modules_functions_as_the_driver_does(fake, capsys):
    import argparse
    import json

    from coppelius.cli import doctor as cmd_doctor
    fake(functions={"cast_bf16": {"regs": 77, "local": 16, "spill": 8}})
    assert cmd_doctor.run(argparse.Namespace(profile="tiny", json=True, device=0)) == 0
    report = json.loads(capsys.readouterr().out)
    files = {m["file"] for m in report["modules"]}
    assert files == {e.file.name for e in ptx.Manifest.load("tiny", "sm_90a").entries.values()}
    cast = next(f for m in report["modules"] for f in m["functions"] if f["entry"] == "cast_bf16")
    assert (cast["registers"], cast["local_bytes"], cast["spill_stores"]) == (77, 16, 8)
    assert cast["threads"] == 256 and cast["max_threads"] == 1024


@pytest.mark.parametrize("version,driver,refused", [
    ("12.6.2", None, "holds the GIL"), ("12.9.0", 12080, "holds the GIL"), ("12.9.1", 12080, None),
    ("12.9.1", 13000, None), ("13.0.0", 13000, None), ("13.4.4", 13000, None),
    ("13.0.0", 12080, "needs a CUDA 13 driver; this one is CUDA 12.8")])
def test_bindings_floor_and_major(version, driver, refused):
    if refused is None:
        drv.check_bindings_version(version, driver)
    else:
        with pytest.raises(drv.BindingsMismatch, match=refused):
            drv.check_bindings_version(version, driver)


def test_the_pyproject_floor_is_the_drivers():
    import re
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"cuda-python>=([\d.]+),<(\d+)"', text)
    assert floor, "pyproject.toml must depend on cuda-python with a floor"
    assert tuple(int(x) for x in floor.group(1).split(".")) == drv.BINDINGS_FLOOR
    assert int(floor.group(2)) == 14


def test_a_fence_timeout_leaves_what_the_gpu_may_touch_unfreed(fake, tmp_path, monkeypatch):
    """The stream never drains: the run ends with its tail, and close frees nothing (process exit
    does), with a note."""
    from coppelius.backends.cuda import backend as backend_cuda
    from coppelius.results.reader import read
    from coppelius.run.loop import Request, run
    monkeypatch.setattr(backend_cuda, "DRAIN_TIMEOUT_S", 0.05)
    f = fake(hang=True)
    (tmp_path / "c.ckpt").write_bytes(b"")
    with pytest.warns(drv.ReleaseWarning, match="still busy .* left for process exit"):
        summary = run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt",
                              result=tmp_path / "r.bin", backend="cuda",
                              directory=tmp_path / "run", fence_timeout_s=0.1))
    assert summary.outcome == R.OUTCOME_DEVICE_ERROR
    rf = read(tmp_path / "r.bin")
    assert int(rf.error_notifier["info32"]) == R.INFO_FENCE_TIMEOUT
    assert f.busy and f.allocations and f.host         # device buffers and staging still there


def test_a_drained_run_frees_everything(fake, tmp_path):
    from coppelius.run.loop import Request, run
    f = fake()
    (tmp_path / "c.ckpt").write_bytes(b"")
    run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "r.bin",
                backend="cuda", directory=tmp_path / "run"))
    assert not f.allocations and not f.host


class _FailAt:
    """Progress that raises a host bug at one step (after a publication started)."""

    def __init__(self, step):
        self.at = step

    def start(self, *a): ...
    def published(self, *a): ...
    def note(self, *a): ...
    def stop(self): ...

    def step(self, step, loss):
        if step == self.at:
            raise RuntimeError("host bug")


def _slow_publications(monkeypatch, seconds):
    """Publications take `seconds` more; the fake device's records pass the marker check (it runs
    only the releases), so the run reaches its update steps."""
    import time

    from coppelius.run import publisher
    from coppelius.staging.views import StagingViews
    monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    real = publisher.ckpt.publish_chunks

    def slow(*a, **k):
        time.sleep(seconds)
        return real(*a, **k)
    monkeypatch.setattr(publisher.ckpt, "publish_chunks", slow)


def _publishers_alive():
    import threading
    return [t.name for t in threading.enumerate() if t.name.startswith("publish-") and t.is_alive()]


def test_an_unexpected_error_joins_the_publisher_before_the_region_goes(fake, tmp_path, monkeypatch):
    from coppelius.run.loop import Request, run
    f = fake()
    _slow_publications(monkeypatch, 0.3)
    alive_at_free = []
    free_host = f.cuMemFreeHost
    f.cuMemFreeHost = lambda p: (alive_at_free.append(_publishers_alive()), free_host(p))[1]
    (tmp_path / "c.ckpt").write_bytes(b"")
    with pytest.raises(RuntimeError, match="host bug"):
        run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "r.bin",
                    backend="cuda", directory=tmp_path / "run"),
            _FailAt(TINY.checkpoint_interval))          # the publication of step 4 is in flight
    assert alive_at_free == [[]]                        # freed once, with no publisher running
    assert (tmp_path / "c.ckpt").stat().st_size > 0     # that publication completed
    assert not f.host and not f.allocations


def test_a_publisher_that_outlives_the_join_leaves_staging_to_process_exit(fake, tmp_path,
                                                                         monkeypatch):
    from coppelius.run import loop as run_mod
    f = fake()
    _slow_publications(monkeypatch, 0.5)
    monkeypatch.setattr(run_mod, "PUBLISHER_JOIN_S", 0.01)
    (tmp_path / "c.ckpt").write_bytes(b"")
    try:
        with pytest.warns(drv.ReleaseWarning, match="publisher thread still streams"), \
                pytest.raises(RuntimeError, match="host bug"):
            run_mod.run(run_mod.Request(profile=TINY, checkpoint=tmp_path / "c.ckpt",
                                        result=tmp_path / "r.bin", backend="cuda",
                                        directory=tmp_path / "run"),
                        _FailAt(TINY.checkpoint_interval))
        assert f.host and f.allocations                 # the thread may still use them
    finally:
        import threading
        for t in threading.enumerate():
            if t.name.startswith("publish-"):
                t.join()


def test_the_readme_and_the_refusal_hint_state_the_kernels_shared_memory_needs():
    from coppelius.backends.cuda.backend import SHARED_HINT
    readme = (ROOT / "README.md").read_text()
    need = {(p, t): max(e.shared for e in ptx.Manifest.load(p, t).entries.values())
            for p in ("coppelius", "tiny") for t in ("sm_90a", "sm_80")}
    for value in need.values():
        assert f"{value:,} B" in readme
    assert f"{need['coppelius', 'sm_80']:,} B" in SHARED_HINT


@pytest.mark.parametrize("profile", ["tiny", "coppelius"])
def test_captured_graphs_have_exactly_the_plans_edges(fake, profile, monkeypatch):
    """Each submission's graph, as the driver would build it from the capture
    (per-stream frontiers, event record/wait edges: tools/fake_driver.py), has one node per
    launch, the side lane's launches on a second stream, and exactly the predecessors
    plan/launches/graph.py gives — no edge missing (a race) and none extra (lost overlap).  The
    coppelius lists are checked without their PTX: only the capture is exercised."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake()
    prof = profiles.get(profile)
    subs = launches.submissions(prof)
    with CudaBackend(TINY) as b:
        if profile != "tiny":            # the capture logic alone, on the production lists
            monkeypatch.setattr(b.capture, "packed",
                                lambda launch, t_base: (_Recorder(launch), None))
            b.capture.submissions = subs
        b.instantiate(5)
        assert len(f.graphs) == 3
        side_streams = set()
        for sub, nodes in zip(subs, list(f.graphs.values())[-3:]):
            assert len(nodes) == len(sub.launches), sub.name
            assert all(n.launch is not None for n in nodes), f"{sub.name}: a non-kernel node"
            main = nodes[0].stream
            overlap = launch_graph.programmatic(sub.launches)
            for i, (node, launch) in enumerate(zip(nodes, sub.launches)):
                assert node.deps == frozenset(sub.deps[i]), (sub.name, launch.label)
                assert node.programmatic == overlap[i], (sub.name, launch.label)
                assert (node.stream == main) == (launch.lane == launches.MAIN_LANE), launch.label
                if launch.lane != launches.MAIN_LANE:
                    side_streams.add(node.stream)
        assert side_streams and main not in side_streams      # the update forks a second stream
    assert any(x.lane == launches.SIDE_LANE for x in subs[1].launches)


class _Recorder:
    """Stands in for a compiled kernel when only the capture is checked: a launch node."""

    def __init__(self, launch):
        self.launch_ = launch
        self.pdl = launch.function not in launches.HAND_WRITTEN      # as on sm_90a

    def launch(self, stream, grid, params, programmatic=False):
        drv.check(drv.cu().cuLaunchKernel(self.launch_.kernel, *grid, 1, 1, 1, 0, stream.handle,
                                          0, 0, programmatic=programmatic), "cuLaunchKernel")


@pytest.mark.parametrize("cc,pdl,expect", [((9, 0), True, True), ((9, 0), False, False),
                                           ((8, 6), True, False)])
def test_programmatic_edges_only_where_the_kernels_wait(fake, cc, pdl, expect):
    """On sm_90a the graphs' plan-allowed edges are captured programmatically through
    cuLaunchKernelEx (and nothing else is); with pdl=False, or on sm_80 (whose PTX has no
    griddepcontrol: manifest pdl false), every launch is a plain cuLaunchKernel."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake(cc)
    with CudaBackend(TINY, pdl=pdl) as b:
        b.instantiate(3)
        for sub, nodes in zip(launches.submissions(TINY), list(f.graphs.values())[-3:]):
            want = launch_graph.programmatic(sub.launches) if expect else (False,) * len(nodes)
            assert tuple(n.programmatic for n in nodes) == want, sub.name
        assert any(f.programmatic_log) == expect


def test_a_refused_programmatic_capture_is_captured_again_in_full(fake):
    """A driver that refuses programmatic launches in a capture: the backend captures the same
    graphs with every edge full (same nodes, same edges), warns naming the refusal and keeps it
    in `pdl_refused`; the run still goes through the ring."""
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.backends.cuda.capture import ProgrammaticLaunchRefused
    from coppelius.run.ring import Ring
    f = fake((9, 0), refuse_programmatic=CUresult.CUDA_ERROR_INVALID_VALUE)
    with CudaBackend(TINY) as b:
        with pytest.warns(ProgrammaticLaunchRefused, match="CUDA_ERROR_INVALID_VALUE from "
                                                           "cuLaunchKernelEx"):
            b.instantiate(3)
        assert not b.pdl and "cuLaunchKernelEx" in b.pdl_refused
        assert not any(b.programmatic_edges.values())
        subs = launches.submissions(TINY)
        for sub, nodes in zip(subs, list(f.graphs.values())[-3:]):
            assert [n.deps for n in nodes] == [frozenset(d) for d in sub.deps], sub.name
            assert not any(n.programmatic for n in nodes)
        Ring(b, capacity=1).run(L.SUBMISSION_FORWARD, context=0, step=None)


def test_a_full_edge_capture_failure_is_raised(fake, monkeypatch):
    """The fallback is for the programmatic edges only: when the full-edge capture fails too,
    the error reaches the caller."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake((9, 0), refuse_programmatic=CUresult.CUDA_ERROR_INVALID_VALUE)
    with CudaBackend(TINY) as b:
        monkeypatch.setattr(f, "cuGraphInstantiate",
                            lambda g, flags: (CUresult.CUDA_ERROR_INVALID_VALUE, None))
        with pytest.raises(drv.DriverError, match="cuGraphInstantiate"):
            b.instantiate(3)


def test_a_kernel_that_does_not_wait_is_never_launched_programmatically(fake):
    """Kernel refuses a programmatic launch of a kernel whose PTX has no griddepcontrol.wait
    (manifest pdl false): it would race the kernel before it."""
    from coppelius.backends.cuda.backend import CudaBackend
    fake((9, 0))
    with CudaBackend(TINY) as b:
        release = next(k for k in b.kernels.values() if k.name.startswith(launches.RELEASE))
        assert not release.pdl
        with pytest.raises(ValueError, match="does not wait"):
            release.launch(b.dev.stream, (1, 1, 1), release.pack([0] * len(release.param_types)),
                           programmatic=True)


def test_an_unjoined_side_lane_is_refused_at_end_of_capture(fake):
    """A capture whose second stream is not joined back is the driver's
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED: the fake refuses it too, so the join test above means
    something."""
    f = fake()
    dev = Device()
    side = Stream()
    fork = Event(timing=False)

    def record(stream):
        fork.record(stream)
        side.wait(fork)
        drv.check(f.cuLaunchKernel("k", 1, 1, 1, 1, 1, 1, 0, side.handle, 0, 0), "cuLaunchKernel")

    with pytest.raises(drv.DriverError, match="UNJOINED"):
        Graph(dev.stream, record)
