"""The budgeted device check, run for real without a GPU (`--dry-run`), and its rules.

The dry run executes every phase (fake driver for the cuda-only steps, its runs on the cuda backend
computed on the CPU by tools.cpu_cuda with the tiny profile, torch on the CPU) and must leave a
filled report and at most 8 files in $OUT; its runs meet the golden bit for bit.  The runner's rules — skip what no longer fits, a timeout fails a phase and the next still
runs, the report rewritten after every phase — are checked on small phases of their own, and the
cuda backend's per-launch event timing through the fake driver.
"""
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from coppelius.driver import calls as drv
from coppelius.plan import launches, profiles
from coppelius.staging import layout as L

from tools.cost import kernel_stats, measured, per_launch
from tools.fake_driver import CUresult, FakeDriver
from tools.gpu_check import check as G
from tools.gpu_check import experiments as X
from tools.gpu_check import phases
from tools.gpu_check import runner
from tests.support.paths import ROOT


TINY = profiles.get("tiny")
DRY_RUN_TIMEOUT_S = 2400    # ≈ 4 min on an idle 2-core machine; a loaded one is several times slower
DRY_RUN_BUDGET_S = 2400     # no phase skipped for a slow CPU: the phases' timeouts still hold


# ---------------------------------------------------------------- the dry run, end to end

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run as a caller keeping its output runs it: `... 2>&1 | tee $OUT/check.log` (a
    file in $OUT the check did not write, from before its first phase)."""
    out = tmp_path_factory.mktemp("out")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    t = time.monotonic()
    cmd = (f"set -o pipefail; bash {ROOT / 'tools' / 'gpu_check.sh'} --dry-run --out {out} "
           f"--budget {DRY_RUN_BUDGET_S} 2>&1 | tee {out / 'check.log'}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                       env={**env, "PY": sys.executable}, timeout=DRY_RUN_TIMEOUT_S)
    wall = time.monotonic() - t
    print(f"\ngpu_check.sh --dry-run | tee: {wall:.0f} s; {r.stdout[-1800:]}")
    return r, out, json.loads((out / "report.json").read_text())


def test_dry_run_executes_every_phase_and_passes(dry_run):
    r, out, report = dry_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    phases = {p["name"]: p for p in report["phases"]}
    assert list(phases) == [p.name for p in G.PHASES]
    for name, p in phases.items():
        assert p["status"] == "ok", (name, p.get("reason"), p.get("checks"))
        assert p["seconds"] > 0 and p["predicted_s"] > 0, name
        assert p["checks"] and all(c["ok"] for c in p["checks"]), name
        assert "ended_at_phase_end" not in p, name          # nothing left running by a phase
    n = len(G.PHASES)
    assert f"verdict (dry-run): {n} ok, 0 failed, 0 skipped" in r.stdout.splitlines()[-1]
    assert report["mode"] == "dry-run" and report["machine"]["python"]


def test_dry_run_out_holds_at_most_eight_files_the_tee_among_them(dry_run):
    """A `tee $OUT/check.log` is counted against the 8 and named, never an error; it holds the
    whole output, the table at its end."""
    _, out, report = dry_run
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert len(files) <= G.MAX_OUT_FILES, files
    assert set(files) <= set(G.OUT_FILES) | {"check.log"}, files
    assert {"report.md", "report.json", "logs.tar.gz", "per_launch.json", "bench.json",
            "check.log"} <= set(files)
    assert report["out"]["foreign"] == ["check.log"]
    assert "verdict (dry-run)" in (out / "check.log").read_text().splitlines()[-1]
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    for log in ("logs/doctor/doctor.log", "logs/tiny/verify.log", "logs/gpu-tests/pytest.log",
                "logs/production/continuation-2.log", "logs/per-launch/per-launch.log",
                "logs/experiments/experiments.log", "logs/calibration/calibration.log",
                "logs/calibration/calibration.json", "logs/sanitizer/memcheck.log",
                "logs/sanitizer/racecheck.log", "logs/torch/bench.log",
                "logs/torch-default/bench-default.log"):
        assert log in names, (log, names)
    md = (out / "report.md").read_text()
    assert all(p.title in md for p in G.PHASES) and "check.log" in md
    assert "## Experiments" in md and "What the plan should keep" in md
    assert "## Calibration (the cost model's inputs, measured)" in md


def test_dry_run_figures_are_filled(dry_run):
    _, out, report = dry_run
    p = {x["name"]: x for x in report["phases"]}
    d = p["doctor"]
    assert d["modules"] > 0 and d["functions"] >= d["modules"] and d["registers_max"] > 0
    assert d["target"] == "sm_90a" and not d["functions_without_jit_log"]
    assert all(f["registers"] > 0 for f in d["function_table"])
    t = p["tiny"]
    # a cuda run computed on the CPU (tools.cpu_cuda): the golden's bits, what ran it apart
    assert t["golden_verdict"] == ("identical except time-dependent, environment and identity "
                                   "fields"), t
    assert all(s.get("max_abs", 0) == 0 for s in t["golden_sections"]), t["golden_sections"]
    assert {r["field"] for r in t["identity"]} >= {"backend", "device_name"}, t["identity"]
    assert t["tiny"]["steps"] == TINY.steps and t["tiny"]["device_ms_p50"] > 0
    # step 0's digests against the golden's (cuda on the CPU against interpret: every launch equal)
    assert t["bisect"]["exit"] == 0 and t["bisect"]["same"] and t["bisect"]["first"] is None
    gt = p["gpu-tests"]
    assert gt["counts"] and gt["counts"].get("deselected", 0) >= len(phases.COVERED)
    assert gt["covered_by_phases"] == {test: "tiny" for test in phases.COVERED}
    assert gt["per_test_timeout"]
    prod = p["production"]
    run = prod["run"]
    for k in ("device_ms_p50", "device_ms_p90", "device_ms_max", "host_gap_us_p50",
              "host_gap_us_p99", "fence_to_fence_ms_p50", "steps_per_s"):
        assert run[k] is not None and run[k] > 0, k
    assert [c["bit_identical"] for c in prod["continuation"]] == [True, True]
    assert prod["reused"] == {"reference": "the run of phase tiny"}
    pl = p["per-launch"]
    n_update = len(launches.submissions(TINY)[L.SUBMISSION_UPDATE].launches)
    assert pl["launches"] == n_update and pl["graph_us_p50"] > 0 and pl["sum_of_launches_us"] > 0
    assert pl["predicted_update_us"]["central"] > 0 and pl["predictions_unavailable"] is None
    # the graph replay is predicted on two lanes; the launches one by one add up to more
    assert pl["predicted_serial_sum_us"]["central"] > pl["predicted_update_us"]["central"]
    for name in ("torch", "torch-default"):
        rows = p[name]["rows"]
        assert rows[0]["what"].startswith("coppelius") and rows[0]["ms_p50"] > 0
        for row in rows[1:]:
            assert row["ms_p50"] > 0 and row["ratio"] > 0
            assert row["agreement"] < 5e-3, row            # same weights, contexts, learner
    assert p["torch"]["rows"][2]["compile_s"] is not None
    full = p["full-run"]
    assert full["run"]["publications"] == TINY.publications == len(full["publications"])
    assert all("stall_ms" in x and x["stream_s"] >= 0 for x in full["publications"])
    assert full["reused"] == {"full": "the run of phase tiny"}     # the tiny profile's full run


def test_dry_run_experiments_and_sanitizer_are_reported(dry_run):
    """Every capture variant replayed through the fake driver, side by side with its prediction;
    each side-lane launch alone; a decision per experiment.  The sanitizer's commands ran
    without compute-sanitizer, which the report says."""
    _, _, report = dry_run
    rows = report["experiments"]
    graphs = {(r["name"], r["capture"]) for r in rows if r["graph_us"] is not None}
    assert graphs == {(name, variant) for name, pair in X.PAIRS.items() for _, variant in pair}
    assert all(r["graph_us"] > 0 and r["predicted_us"] > 0 for r in rows if r["graph_us"])
    alone = [r for r in rows if r["name"] == X.SIDE_ALONE and r["variant"] != X.SIDE_SUM]
    assert len(alone) == len(X.side_lane(TINY)) and all(r["per_launch_us"] > 0 for r in alone)
    assert {d["name"] for d in report["decisions"]} == {X.EDGES, X.LANES, X.SIDE_WORK,
                                                        X.PRIORITY, X.SIDE_ALONE}
    s = {x["name"]: x for x in report["phases"]}["sanitizer"]
    assert "not found" in s["sanitizer"] and "dry run" in s["sanitizer"]
    functions = {x.label: x.function for x in launches.submissions(TINY)[L.SUBMISSION_UPDATE].launches}
    assert s["racecheck_launches"] and all(
        functions[label].startswith(("attention", "weight_grad")) for label in s["racecheck_launches"])


def test_dry_run_per_launch_table_calibrates_the_cost_model(dry_run):
    """per_launch.json is what `python -m tools.build_ptx --report --measured` reads: every launch
    of the update once, each with the kernel the model costs."""
    _, out, _ = dry_run
    rows = measured.read_measured(out / "per_launch.json")
    from coppelius.backends.cuda import ptx
    stats = {k: kernel_stats.KernelStats(32, e.shared, e.threads)
             for k, e in ptx.Manifest.load("tiny", "sm_90a").entries.items()}
    costs = per_launch.model(TINY, "update", stats)
    table = measured.compare(costs, rows)
    assert f"| **measured launches** | {len(costs)}/{len(costs)} |" in table
    bench = json.loads((out / "bench.json").read_text())
    assert [r["variant"] for r in bench["rows"]] == ["coppelius", "eager", "reduce-overhead",
                                                     "default"]


def test_dry_run_calibration_sets_each_figure_beside_the_model(dry_run):
    """The calibration ran its kernels on the fake driver (triton and torch blocked) and the
    report sets every figure beside the input of tools/cost/inputs.py it calibrates; the fake
    device's figures are round numbers, plainly no GPU's."""
    _, _, report = dry_run
    from tools.gpu_check import calibration_model as CM
    from tools.gpu_check import fake_calibration as fake_cal
    p = {x["name"]: x for x in report["phases"]}["calibration"]
    assert p["errors"] == {} and p["model_unavailable"] is None
    assert p["device"]["name"] == "Fake H200" and p["device"]["sms"] == fake_cal.FAKE_SMS
    rows = {r["name"]: r for r in report["calibration"]}
    assert set(rows) == set(CM.ROWS)
    assert all(r["measured"] > 0 and r["central"] > 0 for r in rows.values())
    assert rows["L2 read bandwidth"]["measured"] == fake_cal.FAKE_L2_BW / 1e12
    assert rows["launch in a graph, full edge"]["measured"] == fake_cal.FAKE_LAUNCH_NS / 1e3
    assert p["launch"]["programmatic"]["slope_s"] == pytest.approx(fake_cal.FAKE_LAUNCH_PDL_NS * 1e-9)


# ---------------------------------------------------------------- the runner's rules

def _check(tmp_path, predicted: dict, budget: float) -> G.Check:
    mode = replace(G.DRY, predicted_s=predicted, timeout_factor=1.0, timeout_extra_s=1.0)
    return G.Check(mode, tmp_path / "out", budget)


def test_a_phase_that_no_longer_fits_is_skipped_never_started(tmp_path):
    ran = []

    def body(name):
        def run(ctx):
            # the report already holds every earlier phase with its final status
            earlier = json.loads((ctx.out / "report.json").read_text())["phases"]
            assert [p["status"] for p in earlier[:-1]] == ["ok", "skipped"][:len(earlier) - 1]
            assert earlier[-1]["status"] == "running"
            ran.append(name)
            time.sleep(0.3)
            return name
        return run
    phases = [G.Phase("a", "a", body("a")), G.Phase("b", "b", body("b")),
              G.Phase("c", "c", body("c")), G.Phase("d", "d", body("d"))]
    check = _check(tmp_path, {"a": 0.1, "b": 5.0, "c": 0.1, "d": 0.5}, budget=1.0)
    assert check.run(phases) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    status = {p["name"]: p["status"] for p in report["phases"]}
    # b needs more than the whole budget; d no longer fits once a and c spent 0.6 s of it
    assert status == {"a": "ok", "b": "skipped", "c": "ok", "d": "skipped"}
    assert ran == ["a", "c"]
    assert "predicted 5 s" in report["phases"][1]["reason"]
    assert (tmp_path / "out" / "logs.tar.gz").exists()


def test_a_phase_past_its_timeout_fails_and_the_next_still_runs(tmp_path, monkeypatch):
    pidfile = tmp_path / "grandchild.pid"

    def hang(ctx):      # a child with a grandchild: the whole process group must go
        ctx.sh("sleep", ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])

    def after(ctx):
        ctx.expect("echo", ctx.sh("echo", ["echo", "hi"]).rc == 0)
        return "ran"
    check = _check(tmp_path, {"hang": 0.5, "after": 0.1}, budget=30)
    t = time.monotonic()
    assert check.run([G.Phase("hang", "hang", hang), G.Phase("after", "after", after)]) == 1
    assert time.monotonic() - t < 10
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    hung, nxt = report["phases"]
    assert hung["status"] == "failed" and hung["reason"].startswith("failed: timeout"), hung
    assert nxt["status"] == "ok" and nxt["summary"] == "ran"
    stat = Path(f"/proc/{pidfile.read_text().strip()}/stat")
    assert not stat.exists() or stat.read_text().split(") ", 1)[1][0] == "Z"   # gone or a zombie


def test_sigterm_ends_the_command_in_flight_and_writes_the_report(tmp_path):
    """Stopped from outside, the check kills its running command's process group, reports the
    phase failed and the rest skipped, and leaves the report."""
    pidfile, out = tmp_path / "child.pid", tmp_path / "out"
    script = f"""
import sys
from dataclasses import replace
from pathlib import Path
from tools.gpu_check import check as G
def hang(ctx):
    ctx.sh("sleep", ["bash", "-c", "sleep 60 & echo $! > {pidfile}; wait"])
mode = replace(G.DRY, predicted_s={{"hang": 1, "next": 1}})
sys.exit(G.Check(mode, Path({str(out)!r}), 100).run([G.Phase("hang", "hang", hang),
                                                     G.Phase("next", "next", hang)]))
"""
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    p.terminate()
    assert p.wait(timeout=60) == 1
    report = json.loads((out / "report.json").read_text())
    assert [(x["name"], x["status"]) for x in report["phases"]] == [("hang", "failed"),
                                                                    ("next", "skipped")]
    assert report["phases"][0]["reason"] == "interrupted (SIGTERM)"
    stat = Path(f"/proc/{pidfile.read_text().strip()}/stat")
    assert not stat.exists() or stat.read_text().split(") ", 1)[1][0] == "Z"


def test_a_failed_check_fails_its_phase_with_the_output_tail(tmp_path):
    def body(ctx):
        ctx.expect("false", ctx.sh("false", ["bash", "-c", "echo why it failed; exit 3"]).rc == 0,
                   ctx.sh("again", ["bash", "-c", "echo why it failed; exit 3"]))
        return "done"
    check = _check(tmp_path, {"p": 0.1}, budget=10)
    assert check.run([G.Phase("p", "p", body)]) == 1
    p = json.loads((tmp_path / "out" / "report.json").read_text())["phases"][0]
    assert p["status"] == "failed" and p["reason"] == "failed: false"
    assert p["checks"][0]["rc"] == 3 and "why it failed" in p["checks"][0]["tail"]
    assert "**FAILED**: false" in (tmp_path / "out" / "report.md").read_text()


def test_a_file_in_out_the_check_did_not_write_is_counted_never_an_error(tmp_path):
    """A foreign file in $OUT (a tee of the output, or one a phase leaves) must not make the
    first write raise (no table, the work dir left behind): it is counted and named."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "check.log").write_text("a tee\n")

    def body(ctx):
        (ctx.out / "stray.txt").write_text("x")
        return "wrote a stray file"
    check = _check(tmp_path, {"p": 0.1}, budget=10)
    assert check.run([G.Phase("p", "p", body)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["phases"][0]["status"] == "ok"
    assert report["out"]["foreign"] == ["check.log", "stray.txt"]
    assert "stray.txt" in (out / "report.md").read_text()
    assert not check.work.exists()


def test_phase_files_past_the_eight_go_into_the_logs(tmp_path):
    """With five foreign files only the three core files fit: a phase file goes into
    logs.tar.gz (logs/held-back/) and the report says so; one already in $OUT is rewritten."""
    out = tmp_path / "out"
    out.mkdir()
    for i in range(4):
        (out / f"mine-{i}.txt").write_text("x")

    def body(ctx):
        assert ctx.check.outdir.place("per_launch.json", b"[1]").parent == ctx.out   # the 8th
        (ctx.out / "late.txt").write_text("x")                                      # a 9th
        where = ctx.check.outdir.place("bench.json", b"{}")
        assert where.parent.name == "held-back"
        assert ctx.check.outdir.place("per_launch.json", b"[2]").parent == ctx.out
        return "placed"
    check = _check(tmp_path, {"p": 0.1}, budget=10)
    assert check.run([G.Phase("p", "p", body)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["out"]["held_back"] == ["bench.json"]
    assert (out / "per_launch.json").read_bytes() == b"[2]" and not (out / "bench.json").exists()
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert tar.extractfile("logs/held-back/bench.json").read() == b"{}"


@pytest.mark.parametrize("ending", ["returns", "fails", "raises", "times out"])
def test_every_process_a_phase_started_ends_with_the_phase(tmp_path, ending):
    """Whatever a phase started is ended when it ends, whatever its outcome: the production
    phase's background verify must not outlive a continuation that timed out or raised."""
    pidfile = tmp_path / "bg.pid"

    def body(ctx):
        ctx.start("background", ["bash", "-c", f"echo $$ > {pidfile}; exec sleep 60"])
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if ending == "fails":
            raise G.PhaseFailed("a continuation failed")
        if ending == "raises":
            raise RuntimeError("a bug in the check")
        if ending == "times out":
            ctx.sh("hang", ["sleep", "60"])
        return "left it running"
    check = _check(tmp_path, {"p": 0.5}, budget=30)
    check.run([G.Phase("p", "p", body)])
    pid = int(pidfile.read_text())
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split(") ", 1)[1][0] == "Z"
    entry = json.loads((tmp_path / "out" / "report.json").read_text())["phases"][0]
    assert pid in entry["ended_at_phase_end"]


def test_an_interrupt_after_a_phase_finished_keeps_its_verdict(tmp_path):
    """A SIGTERM arriving while the report is written after a phase leaves that finished phase
    ok; only the later phases are skipped."""
    class Late(G.Check):
        writes = 0

        def write(self):
            super().write()
            Late.writes += 1
            if Late.writes == 2:             # the write right after phase a finished
                raise runner.Interrupted("SIGTERM")
    mode = replace(G.DRY, predicted_s={"a": 0.1, "b": 0.1}, timeout_factor=1.0,
                   timeout_extra_s=1.0)
    check = Late(mode, tmp_path / "out", 10)
    assert check.run([G.Phase("a", "a", lambda ctx: "done"),
                      G.Phase("b", "b", lambda ctx: "never")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(p["name"], p["status"]) for p in report["phases"]] == [("a", "ok"), ("b", "skipped")]
    assert report["phases"][1]["reason"] == "the check was interrupted (SIGTERM)"


def test_a_capped_phase_starts_with_its_minimum_and_stops_at_what_is_left(tmp_path, monkeypatch):
    """Torch's phases are capped: predicted past what is left, they still start while their
    minimum is left, and are stopped at the budget (plus the slack) instead of running on."""
    monkeypatch.setattr(runner, "HARD_SLACK_S", 0.5)
    mode = replace(G.DRY, predicted_s={"c": 100.0, "d": 100.0}, timeout_factor=2.0,
                   timeout_extra_s=30.0, capped_s={"c": 1.0, "d": 5.0})
    check = G.Check(mode, tmp_path / "out", 3.0)
    t = time.monotonic()
    check.run([G.Phase("c", "c", lambda ctx: ctx.sh("slow", ["sleep", "60"])),
               G.Phase("d", "d", lambda ctx: "never")])
    assert time.monotonic() - t < 10
    c, d = json.loads((tmp_path / "out" / "report.json").read_text())["phases"]
    assert c["status"] == "failed" and c["reason"].startswith("failed: timeout"), c
    assert c["timeout_s"] <= 3.5
    assert d["status"] == "skipped" and d["reason"].startswith("capped"), d


# ---------------------------------------------------------------- per-launch events (fake driver)

@pytest.fixture
def fake(monkeypatch):
    f = FakeDriver()
    monkeypatch.setattr(drv, "_cu", f)
    return f


def test_update_launches_are_timed_one_by_one_between_events(fake):
    import numpy as np
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.backends.cuda.timing import TIMING_LEAD_MIN
    with CudaBackend(TINY) as b:
        b.instantiate(t_base=-1)
        t = b.time_submission(L.SUBMISSION_UPDATE, repeats=3)
        update = launches.submissions(TINY)[L.SUBMISSION_UPDATE].launches
        assert t.labels == tuple(x.label for x in update)
        assert t.kernels == tuple(x.kernel for x in update)
        assert np.asarray(t.launch_us).shape == (3, len(update))
        assert (np.asarray(t.launch_us) >= 0).all() and len(t.graph_us) == 3
        assert min(t.graph_us) > 0 and TIMING_LEAD_MIN <= t.lead
        # outside the graph: each launch once per repeat (+ the warm-up), in the list's order
        replayed = [f for f, *_ in fake.launch_log[-len(update):]]
        assert replayed == [b.kernels[x.kernel].function for x in update]
    assert not fake.events                              # every event destroyed


def test_starved_repeats_are_those_the_host_enqueued_slower_than_the_device_ran_ahead():
    from coppelius.backends.cuda.timing import SubmissionTiming
    t = SubmissionTiming(("a",), ("k",), launch_us=[[1.0]] * 3, graph_us=[10.0, 10.0, 10.0],
                         enqueue_us=[25.0, 31.0, 5.0], lead_us=[20.0, 20.0, 20.0])
    assert t.starved == 1           # 31 µs of enqueuing behind 20 + 10 µs of queued work


def test_a_failing_event_call_is_named(fake, monkeypatch):
    from coppelius.backends.cuda.backend import CudaBackend
    with CudaBackend(TINY) as b:
        b.instantiate(t_base=-1)
        monkeypatch.setattr(fake, "cuEventRecord", lambda e, s: (CUresult.CUDA_ERROR_INVALID_HANDLE,))
        with pytest.raises(drv.DriverError, match="CUDA_ERROR_INVALID_HANDLE from cuEventRecord"):
            b.time_submission(L.SUBMISSION_UPDATE, repeats=1)
    assert not fake.events
