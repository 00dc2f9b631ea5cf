"""The device check's calibration (tools/gpu_check/calibrate.py): its hand-written PTX assembles
and matches the table the host and the fake driver read; on the fake driver every experiment
returns the fake device's figures exactly, beside the cost model's inputs; its device-side
checks can fail; a device without programmatic launch, a driver that refuses it and a GPU that
stops answering are each reported; the phase puts the rows into the report."""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import replace

import pytest

from coppelius.driver import calls as drv
from tools.cost import inputs as ci
from tools.fake_driver import CUresult, FakeDriver
from tools.gpu_check import calibrate as C
from tools.gpu_check import calibration_lab as CL
from tools.gpu_check import calibration_model as CM
from tools.gpu_check import calibration_runs as CR
from tools.gpu_check import check as G
from tools.gpu_check import device as D
from tools.gpu_check import fake_calibration as fake_cal
from tests.tools.test_ptx import _grid_dependency_problems, _ptxas

# each PTX file -> the targets it is assembled for: the module JIT-loads on every device the
# backend runs (sm_80 and sm_90a), the programmatic one only from compute capability 9.0
TARGETS = {CL.MODULE_PTX: ("sm_80", "sm_90a"), CL.PDL_PTX: ("sm_90a",)}
PARAM = re.compile(r"\.param\s+\.(\w+)(\s+\.ptr)?")
PTX_TYPES = {"u64": ("u64", "ptr"), "u32": ("u32",), "f32": ("f32",)}


@pytest.fixture
def fake(monkeypatch):
    f = FakeDriver()
    monkeypatch.setattr(drv, "_cu", f)
    return f


def _entries(path) -> dict:
    """entry -> (its .param types with .ptr marked, its .reqntid), from the PTX text."""
    text = path.read_text()
    out = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\((.*?)\)\s*\.reqntid (\d+)", text, re.S):
        params = [p.group(1) + ("*" if p.group(2) else "") for p in PARAM.finditer(m.group(2))]
        out[m.group(1)] = (params, int(m.group(3)))
    return out


# ---------------------------------------------------------------- the PTX

@pytest.mark.parametrize("path,target", [(p, t) for p, ts in TARGETS.items() for t in ts],
                         ids=lambda x: getattr(x, "name", x))
def test_the_calibration_ptx_assembles_for_its_targets(path, target):
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas on this machine (nor in Triton's install) to assemble the "
                    "calibration PTX")
    r = subprocess.run([ptxas, f"-arch={target}", "-v", str(path), "-o", os.devnull],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "error" not in r.stderr.lower(), r.stderr[-2000:]
    assert set(re.findall(r"(\d+) bytes spill (?:stores|loads)", r.stderr)) <= {"0"}, r.stderr
    for entry in _entries(path):
        assert f"Compiling entry function '{entry}'" in r.stderr, entry


def test_the_ptx_is_what_the_host_and_the_fake_driver_decode():
    """Every entry's parameters and threads per CTA as calibrate.KERNELS packs them (the fake
    driver decodes launches with the same table), and the PTX plain ASCII (the JIT's rule)."""
    found = {**_entries(CL.MODULE_PTX), **_entries(CL.PDL_PTX)}
    assert set(found) == set(CL.KERNELS) == fake_cal.FakeCalibration.CALIBRATION
    for entry, (params, threads) in found.items():
        types, want_threads = CL.KERNELS[entry]
        assert threads == want_threads, entry
        assert len(params) == len(types), entry
        for p, t in zip(params, types):
            assert t in PTX_TYPES[p.rstrip("*")] and (t == "ptr") == p.endswith("*"), (entry, p, t)
    for path in TARGETS:
        path.read_bytes().decode("ascii")
        assert re.search(r"^\.version 8\.0$", path.read_text(), re.M)


def test_the_programmatic_kernel_waits_first_as_the_triton_kernels_do():
    text = CL.PDL_PTX.read_text()
    assert not _grid_dependency_problems(text)
    assert "griddepcontrol" not in CL.MODULE_PTX.read_text()
    assert re.search(r"^\.target sm_90$", text, re.M)


def test_the_chain_visits_every_line_once_per_cycle():
    for lines in (1, 2, 256, 4096):
        seen, x = set(), 0
        for _ in range(lines):
            seen.add(x)
            x = CL.chain_next(x, lines - 1)
        assert len(seen) == lines and x == 0
    assert CL.chain_walk(5, 3, 255) == CL.chain_next(CL.chain_next(CL.chain_next(5, 255), 255), 255)


# ---------------------------------------------------------------- on the fake driver

def _by_name(out: dict) -> dict:
    return {r["name"]: r for r in out["rows"]}


def test_every_experiment_measures_the_fake_devices_figures_beside_the_model(fake):
    """The fake device's figures come back exactly: the same buffer set-up, graph capture,
    events, records and arithmetic a GPU's run goes through."""
    out = C.report(C.calibrate(fence_timeout_s=5.0, repeats=3))
    assert out["errors"] == {} and out["model_unavailable"] is None
    assert all(c["ok"] for c in out["checks"]), out["checks"]
    rows = _by_name(out)
    assert set(rows) == set(CM.ROWS)
    want = {"L2 read bandwidth": fake_cal.FAKE_L2_BW / 1e12, "HBM read bandwidth": fake_cal.FAKE_HBM_BW / 1e12,
            "L2 hit latency, unloaded": fake_cal.FAKE_L2_LATENCY_NS / 1e3,
            "L2 hit latency, loaded": fake_cal.FAKE_L2_LATENCY_NS * fake_cal.FAKE_LOADED / 1e3,
            "HBM latency, unloaded": fake_cal.FAKE_HBM_LATENCY_NS / 1e3,
            "HBM latency, loaded": fake_cal.FAKE_HBM_LATENCY_NS * fake_cal.FAKE_LOADED / 1e3,
            "launch in a graph, full edge": fake_cal.FAKE_LAUNCH_NS / 1e3,
            # the chain's first edge is full: one launch in GRAPH_LAUNCHES at the full cost
            "launch in a graph, programmatic edge": (fake_cal.FAKE_LAUNCH_NS + (CR.GRAPH_LAUNCHES - 1)
                                                     * fake_cal.FAKE_LAUNCH_PDL_NS) / CR.GRAPH_LAUNCHES / 1e3,
            "dependent fp32 FMA": fake_cal.FAKE_FMA_CYCLES,
            "two co-resident CTAs, latency-bound": 1.0, "two co-resident CTAs, issue-bound": 2.0,
            "SM clock": fake_cal.FAKE_CLOCK_HZ / 1e9}
    for name, x in want.items():
        assert rows[name]["measured"] == pytest.approx(x, rel=1e-3), name
    assert out["launch"]["programmatic"]["slope_s"] == pytest.approx(fake_cal.FAKE_LAUNCH_PDL_NS * 1e-9)
    # beside the model: the Range objects of tools/cost/inputs.py, in the row's unit
    for name, (key, unit, scale, _) in CM.ROWS.items():
        r = rows[name]
        if key in CM.RANGES:
            rng = getattr(ci, key)
            assert (r["optimistic"], r["central"], r["pessimistic"]) == pytest.approx(
                (rng.optimistic * scale, rng.central * scale, rng.pessimistic * scale)), name
        assert r["unit"] == unit and r["within"] is not None and r["ratio_central"] is not None
    assert rows["SM clock"]["central"] == pytest.approx(ci.CLOCK_HZ / 1e9)
    # the sizes follow the device: the L2 stream inside its L2, the HBM one 32 L2s
    bw = out["bandwidth"]
    assert bw["l2"]["fits_l2"] and bw["l2"]["footprint_bytes"] <= C.L2_FRACTION * fake_cal.FAKE_L2_BYTES
    assert bw["hbm"]["footprint_bytes"] > (C.HBM_FACTOR - 1) * fake_cal.FAKE_L2_BYTES
    assert out["overlap"]["calibrate_fma_chain"]["two_per_sm"]["sms_by_ctas"] == {"2": fake_cal.FAKE_SMS}
    assert not fake.allocations and not fake.live_graphs            # everything freed


def test_the_models_sharing_rule_for_the_two_fma_kernels():
    """Two latency-bound CTAs fit one SM's issue; two issue-bound ones take turns, unless the
    FMA's latency, not its issue, bounds one alone."""
    assert CM.sharing_ratio(4, 1, 1.0) == 1.0 and CM.sharing_ratio(12, 1, 1.0) == 1.0
    assert CM.sharing_ratio(4, CL.WIDE_CHAINS, 1.0) == 2.0
    assert CM.sharing_ratio(16, CL.WIDE_CHAINS, 1.0) == 1.0
    assert CM.sharing_ratio(12, CL.WIDE_CHAINS, 1.0) == pytest.approx(4 / 3)


def test_the_device_side_checks_fail_where_the_kernels_did_not_do_what_they_say(fake,
                                                                              monkeypatch):
    """A chase that ends off its chain, a stream that ends before the chase beside it, CTAs not
    placed as asked: each check reads what the kernels recorded, so each can fail."""
    real_chase, real_fma = fake._calibrate_chase, fake._fma

    def off_chain(stream, grid, threads, p, steps, delay, out):
        real_chase(stream, grid, threads, p, steps + 1, delay, out)
    monkeypatch.setattr(fake, "_calibrate_chase", off_chain)
    monkeypatch.setattr(C, "LOADED_FACTOR", 0.01)      # the stream ends long before the chase

    def packed(stream, grid, wide, iters, a, b, records):
        monkeypatch.setattr(fake, "sms", fake_cal.FAKE_SMS // 2)      # every CTA on half the SMs
        try:
            real_fma(stream, grid, wide, iters, a, b, records)
        finally:
            monkeypatch.setattr(fake, "sms", fake_cal.FAKE_SMS)
    monkeypatch.setattr(fake, "_fma", packed)
    out = C.report(C.calibrate(fence_timeout_s=5.0, repeats=1))
    failed = {c["check"] for c in out["checks"] if not c["ok"]}
    assert failed == {c["check"] for c in out["checks"] if CM.GUARD in c["check"]}
    assert len(failed) == 3, out["checks"]


def test_a_device_before_compute_capability_9_has_no_programmatic_figure(monkeypatch):
    f = FakeDriver(cc=(8, 0))
    monkeypatch.setattr(drv, "_cu", f)
    out = C.report(C.calibrate(fence_timeout_s=5.0, repeats=1))
    assert out["errors"] == {}
    assert out["launch"]["full"]["kernel"] == "calibrate_empty"
    assert out["launch"]["programmatic"] is None
    assert "compute capability 8.0" in out["launch"]["programmatic_unavailable"]
    assert _by_name(out)["launch in a graph, programmatic edge"]["measured"] is None
    assert all(c["ok"] for c in out["checks"]), out["checks"]


def test_a_driver_that_refuses_programmatic_edges_is_named(monkeypatch):
    monkeypatch.setattr(drv, "_cu", FakeDriver(refuse_programmatic=CUresult.CUDA_ERROR_INVALID_VALUE))
    out = C.report(C.calibrate(fence_timeout_s=5.0, repeats=1))
    assert "CUDA_ERROR_INVALID_VALUE" in out["launch"]["programmatic_unavailable"]
    launch = next(c for c in out["checks"] if c["check"].startswith("the launch-cost graphs"))
    assert not launch["ok"]


def test_a_gpu_that_stops_answering_ends_the_calibration_in_seconds(monkeypatch, tmp_path):
    """A hung graph launch: its experiment fails after the fence timeout, the later ones are
    not run, nothing is freed (the GPU may still touch it), the figures before it are kept and
    the exit status says so."""
    f = FakeDriver(hang=True)           # graph launches never finish
    monkeypatch.setattr(drv, "_cu", f)
    path = tmp_path / "c.json"
    assert C.main(["--json", str(path), "--repeats", "1", "--fence-timeout", "0.2"]) == 1
    out = json.loads(path.read_text())
    assert "still busy 0.2 s" in out["errors"]["launch"]
    assert out["errors"]["overlap"].startswith("not run")
    assert _by_name(out)["L2 read bandwidth"]["measured"] > 0
    assert f.allocations                # left for process exit


def test_the_phase_reports_each_figure_beside_the_model(tmp_path):
    """The calibration phase alone in the dry run: the tool through the fake driver with triton
    and torch blocked, its rows in report.json and report.md, its checks in the phase."""
    mode = replace(G.DRY, predicted_s={"calibration": 10})
    check = G.Check(mode, tmp_path / "out", 120)
    assert check.run([G.Phase("calibration", "calibration", D.phase_calibration)]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    p = report["phases"][0]
    assert p["status"] == "ok" and all(c["ok"] for c in p["checks"]), p
    tb = [f"{x / 1e12:.4g}" for x in (ci.L2_BW.optimistic, ci.L2_BW.central, ci.L2_BW.pessimistic)]
    fake_tb = f"{fake_cal.FAKE_L2_BW / 1e12:.4g}"
    assert p["summary"].startswith(f"measured (model central): L2 TB/s {fake_tb} ({tb[1]})")
    assert {r["name"] for r in report["calibration"]} == set(CM.ROWS)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Calibration (the cost model's inputs, measured)" in md
    assert f"| L2 read bandwidth | `L2_BW` | {fake_tb} | {' | '.join(tb)} | TB/s |" in md


def test_the_fake_drivers_clock_is_the_hosts_until_an_emulated_kernel_runs(fake):
    """What the other users of the fake driver see is unchanged: with no calibration kernel run,
    events read the host's clock, waits and queries move nothing; an emulated kernel then keeps
    its stream busy on the virtual clock, and a host that waits for it sees that time pass."""
    import time
    from coppelius.driver.device import Device
    from coppelius.driver.stream import Event, Stream, elapsed_ms
    dev = Device()
    other = Stream()
    a, b = Event(), Event()
    a.record(dev.stream)
    other.wait(a)
    time.sleep(0.01)
    b.record(other)
    b.synchronize()
    assert dev.stream.query() and other.query()
    assert 10 <= elapsed_ms(a, b) < 1000 and fake.hidden_ns == 0
    assert all(t <= time.perf_counter_ns() for t in fake.stream_clock.values())
    start, end = fake._busy(other.handle, 5e9)             # 5 s of emulated work
    assert fake.device_now(other.handle) == end and fake.device_now(dev.stream.handle) < end
    c = Event()
    c.record(other)
    c.synchronize()                                        # the host waited 5 s of device time
    assert fake.device_now(dev.stream.handle) >= end
    for x in (a, b, c, other, dev):
        x.close()
