"""The device check's parts without its dry run — the order and the time plan, bounded
fences and per-test timeouts, a failed run's tail, the experiments' decisions, the sanitizer's
findings, a bench stopped half-way, and the log archive's cap."""
import json
import re
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from coppelius.driver import calls as drv
from coppelius.plan import launches, profiles
from coppelius.staging import layout as L
from coppelius.staging import records as R

from tools import bench_torch
from tools.fake_driver import FakeDriver
from tools.gpu_check import check as G
from tools.gpu_check import commands
from tools.gpu_check import device as D
from tools.gpu_check import experiments as X
from tools.gpu_check import launches as GL
from tools.gpu_check import out as O
from tools.gpu_check import phases
from tests.support.paths import ROOT


TINY = profiles.get("tiny")
DOC = ROOT / "docs" / "PERFORMANCE.md"


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


# ---------------------------------------------------------------- order and time plan

def test_the_product_runs_before_the_measurements_and_torch_runs_last():
    """Torch (a slow inductor compile) runs after the 10,000-step full run, last."""
    names = [p.name for p in G.PHASES]
    assert names == ["doctor", "tiny", "production", "full-run", "per-launch", "experiments",
                     "calibration", "sanitizer", "gpu-tests", "torch", "torch-default"]
    assert set(G.GPU.capped_s) == {"torch", "torch-default"} == set(G.DRY.capped_s)
    assert set(G.GPU.predicted_s) == set(names) == set(G.DRY.predicted_s)


def test_the_time_plan_fits_a_rerun_on_a_fresh_machine_in_the_task_time():
    plan = G.time_plan()
    assert plan["fits"] and plan["total_s"] <= G.DEVICE_TIME_S
    assert G.DEFAULT_BUDGET_S["gpu"] + G.HARD_SLACK_S + G.EXIT_RESERVE_S == G.WALL_S
    assert G.RERUN_BUDGET_S + G.HARD_SLACK_S + G.EXIT_RESERVE_S == G.RERUN_WALL_S
    # every uncapped phase's prediction and torch's minimum fit the default budget
    pred = G.GPU.predicted_s
    assert sum(v for k, v in pred.items() if k not in G.GPU.capped_s) + G.GPU.capped_s["torch"] \
        <= G.DEFAULT_BUDGET_S["gpu"]
    assert max(pred.values()) <= G.RERUN_BUDGET_S         # any one phase fits a rerun



def test_the_docs_state_the_command_its_limits_and_each_phases_prediction():
    """The device-check section of docs/PERFORMANCE.md and the script's header say the exact
    command, its wall limit, the rerun, and each phase's predicted H200 seconds (as the code)."""
    doc = _section(DOC, "## The device check: its time plan")
    sh = (ROOT / "tools" / "gpu_check.sh").read_text()
    for text in (doc, sh):
        assert "bash tools/gpu_check.sh" in text
        assert f"{G.WALL_S:.0f} s" in text and f"{G.RERUN_WALL_S:.0f} s" in text
        assert f"--phases a,b --budget {G.RERUN_BUDGET_S:.0f}" in text
        assert f"{G.time_plan()['total_s']:.0f} s" in text
        assert "a GPU machine" in text
        assert not re.search(r"\brun\(command=|timeout_s\s*=", text)
    for name, seconds in G.GPU.predicted_s.items():
        row = re.search(rf"^\| [^|]*`{re.escape(name)}`[^|]* \| {seconds:.0f} \|", doc, re.M)
        assert row, f"no table row for phase {name} predicting {seconds:.0f} s"
    assert f"{G.FENCE_TIMEOUT_S:.0f} s" in doc


# ---------------------------------------------------------------- a hang costs seconds

class _Ctx:
    """The parts of a Context the command builders read."""

    def __init__(self, mode, tmp_path):
        self.mode = mode
        self.check = type("C", (), {"streams": tmp_path / "streams", "logs": tmp_path})()
        self.logs = tmp_path


@pytest.mark.parametrize("mode", [G.GPU, G.DRY], ids=["gpu", "dry-run"])
def test_every_cuda_run_and_tool_bounds_its_fences(tmp_path, mode):
    """Every run in the check waits less for a fence than the default 120 s, well inside the
    phases' timeouts: a hang ends the run itself, its tail written, before it is SIGKILLed."""
    ctx = _Ctx(mode, tmp_path)
    run = commands.run_argv(ctx, "tiny", 2, tmp_path / "c.ckpt", tmp_path / "r.bin")
    tool = commands.cuda_tool(ctx, D.LAUNCHES, "--profile", "tiny")
    calibration = commands.cuda_tool(ctx, D.CALIBRATE, "--json", tmp_path / "c.json")
    for argv in (run, tool, calibration):
        i = argv.index("--fence-timeout")
        assert float(argv[i + 1]) == G.FENCE_TIMEOUT_S
    for phase in ("tiny", "production", "full-run", "per-launch", "experiments", "calibration"):
        timeout = G.GPU.timeout_factor * G.GPU.predicted_s[phase] + G.GPU.timeout_extra_s
        assert G.FENCE_TIMEOUT_S < timeout / 2, phase   # the run ends itself, tail written
    assert G.SANITIZER_FENCE_TIMEOUT_S < G.GPU.timeout_factor * G.GPU.predicted_s["sanitizer"]


def test_the_launch_tool_takes_a_fence_timeout_for_its_ring(monkeypatch, tmp_path):
    seen = []
    real = GL.Ring.__init__

    def spy(self, backend, capacity, timeout_s=None):
        seen.append(timeout_s)
        real(self, backend, capacity, timeout_s)
    monkeypatch.setattr(GL.Ring, "__init__", spy)
    monkeypatch.setattr(drv, "_cu", FakeDriver())
    with GL.opened(TINY, None, tmp_path / "streams", 7.5) as (b, c0):
        assert c0 == 0
    assert seen == [7.5]


def test_gpu_tests_skip_what_an_earlier_phase_ran():
    """The gpu-tests phase does not repeat the tiny phase's two runs, verify and diff."""
    assert phases.covered({"tiny": "ok"}) == phases.COVERED
    assert phases.covered({"tiny": "failed"}) == phases.COVERED          # its verdict is in the report
    assert phases.covered({"tiny": "skipped"}) == {}
    for test in phases.COVERED:
        path, name = test.split("::")
        assert name in phases.defined_functions(ROOT / path), test
        assert path in phases.gpu_test_files()


def test_the_per_test_timeout_is_pytest_timeout_where_installed_else_a_stack_dump(monkeypatch,
                                                                                 tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "pytest_timeout" else real(name, *a))
    args, note = phases.per_test_timeout(12)
    assert args == ["--timeout", "12", "--timeout-method", "thread"] and "12 s" in note
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pytest_timeout" else real(name, *a))
    args, note = phases.per_test_timeout(12)
    assert args == ["-o", "faulthandler_timeout=12"] and "absent" in note
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                        str(tmp_path / "test_x.py")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr              # pytest accepts the fallback


def test_a_run_that_hit_a_fence_timeout_reports_its_notifier_and_tail(tmp_path, monkeypatch):
    """The partial result file a FenceTimeout leaves, as `coppelius inspect --json` reads it, goes
    into the phase's figures: the outcome, the notifier naming the timeout, the last issues."""
    from coppelius.backends.cuda import backend as backend_cuda
    from coppelius.run.loop import Request, run
    monkeypatch.setattr(backend_cuda, "DRAIN_TIMEOUT_S", 0.05)
    monkeypatch.setattr(drv, "_cu", FakeDriver(hang=True))
    (tmp_path / "c.ckpt").write_bytes(b"")
    with pytest.warns(drv.ReleaseWarning):
        run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "r.bin",
                    backend="cuda", directory=tmp_path / "run", fence_timeout_s=0.1))
    check = G.Check(replace(G.DRY, predicted_s={"p": 30}), tmp_path / "out", 60)
    seen = {}

    def body(ctx):
        failed = G.Done("run-a", 3, 0.1, ctx.logs / "x.log")
        (ctx.logs / "x.log").write_text("FenceTimeout\n")
        commands.expect_run(ctx, "run a", failed, tmp_path / "r.bin")
        seen.update(ctx.figures)
        return "inspected"
    check.run([G.Phase("p", "p", body)])
    tail = seen["failed_runs"]["run-a"]
    assert tail["outcome"] == "device error", tail
    assert tail["error_notifier"]["info32"] == R.INFO_FENCE_TIMEOUT
    assert tail["error_notifier"]["info_name"] and tail["last_issues"]["sequence"]



# ---------------------------------------------------------------- experiments

def _pair(name, plan_us, alt_us, edges=40):
    (a, va), (b, vb) = X.PAIRS[name]
    return [{"name": name, "variant": a, "capture": va, "graph_us": plan_us,
             "programmatic_edges": edges, "pdl_refused": None},
            {"name": name, "variant": b, "capture": vb, "graph_us": alt_us,
             "programmatic_edges": 0, "pdl_refused": None}]


@pytest.mark.parametrize("noop_us,verdict", [(1395.0, "hidden"), (1330.0, "partly exposed"),
                                             (1100.0, "the critical path")])
def test_the_no_op_side_lane_says_whether_the_side_lane_is_hidden(noop_us, verdict):
    d = {x["name"]: x for x in X.decide(_pair(X.SIDE_WORK, 1400.0, noop_us))}
    assert d[X.SIDE_WORK]["why"].startswith(verdict)
    assert d[X.SIDE_WORK]["delta_us"] == pytest.approx(1400.0 - noop_us)


def test_a_variant_is_kept_only_when_it_is_decisively_faster():
    rows = _pair(X.EDGES, 1400.0, 1450.0) + _pair(X.LANES, 1400.0, 1200.0)
    d = {x["name"]: x for x in X.decide(rows)}
    assert d[X.EDGES]["keep"] == X.PAIRS[X.EDGES][0][0]
    assert d[X.LANES]["keep"] == X.PAIRS[X.LANES][1][0] and "14.3% faster" in d[X.LANES]["why"]
    close = {x["name"]: x for x in X.decide(_pair(X.LANES, 1400.0, 1390.0))}
    assert close[X.LANES]["keep"] == X.PAIRS[X.LANES][0][0] and "within" in close[X.LANES]["why"]
    refused = {x["name"]: x for x in X.decide(_pair(X.EDGES, 1400.0, 1300.0, edges=0))}
    assert "no programmatic edge" in refused[X.EDGES]["why"]


def test_the_one_lane_prediction_chains_every_launch():
    """The model's one-lane graph costs at least the main lane alone and no more than every
    launch back to back; the plan's two lanes are no slower than one (what the plan assumes)."""
    from coppelius.backends.cuda import ptx
    from tools.cost.kernel_stats import KernelStats
    from tools.cost.per_launch import model
    stats = {k: KernelStats(64, e.shared, e.threads, pdl=e.pdl)
             for k, e in ptx.Manifest.load("tiny", "sm_90a").entries.items()}
    costs = {c.label: c for c in model(TINY, "update", stats)}
    pred = X.predicted(TINY, costs, {k: s.pdl for k, s in stats.items()})
    serial = sum(c.us[X.SCENARIO] for c in costs.values())
    assert pred["noop-side-lane"] <= pred["one-lane"] <= serial + 1e-6
    assert pred["plan"] <= pred["one-lane"] and pred["plan"] <= pred["full-edges"]


def test_only_picks_launches_by_label_or_function_once_per_kernel():
    update = launches.submissions(TINY)[L.SUBMISSION_UPDATE].launches
    picked = GL.chosen(TINY, D.RACECHECK_LAUNCHES, first_per_kernel=True)
    assert [update[i].kernel for i in picked] == list(dict.fromkeys(
        x.kernel for x in update if x.function.startswith(("attention", "weight_grad"))))
    every = GL.chosen(TINY, D.RACECHECK_LAUNCHES, first_per_kernel=False)
    assert len(every) > len(picked)
    with pytest.raises(SystemExit, match="no update launch matches"):
        GL.chosen(TINY, "^nothing$", first_per_kernel=False)


def test_gpu_mode_takes_a_profile_and_tiny_steps():
    m = G.for_profile(G.GPU, "tiny", 3)
    assert (m.production, m.production_steps, m.continuation, m.tiny_steps) == ("tiny", 8,
                                                                                 (4, 4), 3)
    assert G.for_profile(G.GPU, None, None) == G.GPU


# ---------------------------------------------------------------- sanitizer, bench, archive

def test_sanitizer_findings_are_counted_with_their_first_lines():
    mem = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
           "=========     at matmul+0x90\n========= ERROR SUMMARY: 3 errors\n")
    f = D.findings(mem)
    assert f["errors"] == 3 and f["first_lines"][0].endswith("size 4 bytes")
    race = "========= RACECHECK SUMMARY: 5 hazards displayed (1 error, 4 warnings)\n"
    assert {k: D.findings(race)[k] for k in ("hazards", "errors", "warnings")} == \
        {"hazards": 5, "errors": 1, "warnings": 4}
    assert "errors" not in D.findings("plain output, no sanitizer\n")


def test_a_bench_stopped_half_way_leaves_its_rows_and_stage(tmp_path, monkeypatch):
    """bench_torch rewrites its JSON at each stage, so a compile stopped at its cap leaves what
    it finished: a bench ended in its second variant still has the first variant's row and says
    where it was."""
    real = bench_torch.bench_torch_variant

    def second_hangs(torch, variant, *a, stage, **k):
        if variant == "default":
            stage("default: step 1 of 3 (the first: compiling)")
            raise KeyboardInterrupt("stopped from outside")
        return real(torch, variant, *a, stage=stage, **k)
    monkeypatch.setattr(bench_torch, "bench_torch_variant", second_hangs)
    out = tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        bench_torch.main(["--result", str(ROOT / "tests" / "golden" / "tiny-result-c0.bin"),
                          "--device", "cpu", "--steps", "3", "--warmup", "1", "--variants",
                          "eager,default", "--compile-backend", "aot_eager", "--json", str(out)])
    got = D.partial_bench(out)
    assert got["stage"] == "default: step 1 of 3 (the first: compiling)"
    assert [r["variant"] for r in got["rows"]] == ["coppelius", "eager"]
    assert got["rows"][1]["ms_p50"] > 0
    assert D.partial_bench(tmp_path / "none.json")["stage"].startswith("not started")


def test_a_torch_phase_stopped_at_its_cap_reports_the_stage_and_rows(tmp_path, monkeypatch):
    """A bench that overruns its cap is ended, and the phase says where it was and keeps the rows
    it had finished (bench.json too)."""
    from tools.gpu_check import runner
    bench = tmp_path / "slow_bench.py"
    bench.write_text(
        "import json, sys, time\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "rows = [{'what': 'coppelius (interpret)', 'variant': 'coppelius', 'ms_p50': 10.0},\n"
        "        {'what': 'torch eager (cpu)', 'variant': 'eager', 'ms_p50': 5.0, 'ratio': 0.5}]\n"
        "json.dump({'stage': 'reduce-overhead: step 1 of 3 (the first: compiling)',\n"
        "           'rows': rows, 'agreement': {'eager': 1e-6}}, open(path, 'w'))\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(D, "BENCH", bench.stem)                # run as `python -m slow_bench`
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))            # the check's commands inherit it
    monkeypatch.setattr(runner, "HARD_SLACK_S", 1.5)
    mode = replace(G.DRY, predicted_s={"torch": 90.0}, capped_s={"torch": 0.5})
    check = G.Check(mode, tmp_path / "out", 1.0)
    assert check.run([G.Phase("torch", "torch", D.phase_torch)]) == 1
    p = json.loads((tmp_path / "out" / "report.json").read_text())["phases"][0]
    assert p["status"] == "failed" and "stopped at its cap" in p["reason"], p
    assert "compiling" in p["reason"] and "1 torch row(s)" in p["reason"]
    assert p["stage_reached"].startswith("reduce-overhead") and len(p["rows"]) == 2
    kept = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert [r["variant"] for r in kept["rows"]] == ["coppelius", "eager"]


def test_the_log_archive_keeps_each_log_to_its_cap(tmp_path):
    logs = tmp_path / "logs"
    (logs / "p").mkdir(parents=True)
    big = b"head" + b"x" * 5000 + b"tail"
    (logs / "p" / "big.log").write_bytes(big)
    (logs / "p" / "small.log").write_bytes(b"small")
    O.write_logs(tmp_path / "a.tar.gz", logs, cap=1000)
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        kept = tar.extractfile("logs/p/big.log").read()
        assert tar.extractfile("logs/p/small.log").read() == b"small"
    assert len(kept) <= 1000 and kept.startswith(b"head") and kept.endswith(b"tail")
    assert b"left out of the archive" in kept
