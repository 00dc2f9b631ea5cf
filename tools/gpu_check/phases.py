"""The device check's product phases: doctor, tiny, production, the full run, and the GPU tests.

Each phase is a function of a runner.Context that records its checks and figures and returns
the one-line summary the table shows (check.py orders them).
"""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

from tools.make_golden import GOLDEN_DIGESTS

from tools.gpu_check import figures
from tools.gpu_check.commands import cli, expect_run, fresh_run, fresh_runs, run_argv
from tools.gpu_check.report import GOLDEN
from tools.gpu_check.runner import ROOT, Context, PhaseFailed

# GPU tests whose whole check a phase makes: deselected when that phase ran in this check
COVERED = {"tests/host/backends/test_cuda_backend.py::test_tiny_run_on_cuda_twice_is_bit_identical_and_verifies":
           "tiny"}
RAN = ("ok", "failed")          # a phase status whose verdict is in the report


def phase_doctor(ctx: Context) -> str:
    """`coppelius doctor --json` with the compute cache off, so every module's JIT log is real."""
    profile = ctx.mode.production
    done = ctx.sh("doctor", cli(ctx, "doctor", "--profile", profile, "--json"),
                  env={"CUDA_CACHE_DISABLE": "1"}, json_out=True)
    j = done.json()
    ctx.require("doctor --json printed one JSON object", isinstance(j, dict), done)
    ctx.expect("doctor", done.rc == 0 and j.get("ok"), done)
    checks = {c["name"]: c["value"] for c in j.get("checks", [])}
    fns = [f for m in j.get("modules", []) for f in m["functions"]]
    spilled = [f for f in fns if f["spill_stores"]]
    no_log = [f["kernel"] for f in fns if f["spill_stores"] is None]
    ctx.expect("every module loaded with its functions' attributes", bool(fns))
    ctx.figures.update(
        profile=profile, driver=checks.get("driver"), device=checks.get("device"),
        target=checks.get("PTX target"), backend_open=checks.get("backend open"),
        device_limits=checks.get("device limits"), modules=len(j.get("modules", [])),
        functions=len(fns), registers_max=max((f["registers"] for f in fns), default=None),
        spilling_functions=[f["kernel"] for f in spilled],
        spill_bytes=sum(f["spill_stores"] + f["spill_loads"] for f in spilled),
        functions_without_jit_log=no_log,
        shared_max=max((f["shared_dynamic"] + f["shared_static"] for f in fns), default=None),
        function_table=[{k: f[k] for k in ("kernel", "registers", "threads", "shared_dynamic",
                                             "shared_static", "local_bytes", "spill_stores",
                                             "spill_loads")} for f in fns])
    return (f"{ctx.figures['modules']} modules, {len(fns)} functions, regs ≤ "
            f"{ctx.figures['registers_max']}, {len(spilled)} spilling, {checks.get('device')}")


def _start_tiny_digests(ctx: Context):
    """Start a fresh one-step tiny run that digests step 0 launch by launch (`--digests`); it
    runs beside the phase's two runs (it reads nothing of theirs), which saves its time on a
    machine with a core or a GPU to spare.  -> (the started command, result, digests)."""
    d = ctx.work / "runs" / "tiny-digests"
    d.mkdir(parents=True)
    ckpt, result, digests = d / "tiny.ckpt", d / "result.bin", d / "digests.json"
    ckpt.write_bytes(b"")
    return ctx.start("digests", run_argv(ctx, "tiny", 1, ckpt, result) + ["--digests", digests]), \
        result, digests


def _tiny_digests(ctx: Context, started) -> dict:
    """The digests run's step 0 bisected against the interpret golden's digests under the
    tolerances across backends: a tiny run that does not match the golden names its first
    divergent kernel."""
    run, result, digests = started
    r = ctx.wait(run)
    if not expect_run(ctx, "a one-step tiny run with --digests (step 0, launch by launch)", r,
                      result):
        return {"bisect": None}
    b = ctx.sh("bisect-golden", cli(ctx, "bisect", "--across-backends", "--json", GOLDEN_DIGESTS,
                                    digests), json_out=True)
    bj = b.json() or {}
    ctx.expect("its digests against the interpret golden's (bisect --across-backends)",
               b.rc == 0, b)
    first = bj.get("first") or {}
    return {"bisect": {"exit": b.rc, "same": bj.get("same"), "differing": bj.get("differing"),
                       "replay_matches_issue": (bj.get("b") or {}).get("replay_matches_issue"),
                       "first": {k: first.get(k) for k in ("index", "label", "function", "kernel",
                                                           "verdict", "inputs_differing")}
                       if first else None,
                       "first_regions": [{k: r.get(k) for k in ("name", "space", "count",
                                                                "max_abs", "max_rel",
                                                                "first_index", "a", "b")}
                                         for r in first.get("regions", [])][:4],
                       "later": (bj.get("later") or [])[:8]}}


def _bisect_summary(bisect: dict | None) -> str:
    if bisect is None:
        return "digests: no run"
    if bisect["same"]:
        return "bisect: every launch matches"
    first = bisect["first"] or {}
    return (f"bisect: first divergent #{first.get('index')} {first.get('label')} "
            f"({first.get('verdict')})")


def phase_tiny(ctx: Context) -> str:
    """Two fresh tiny runs bit-identical (results and checkpoints); verify against numpy; against
    the interpret golden; step 0's digests (a third run, beside the two) bisected against the
    golden's.  A failed run ends the phase; the runner then ends the digests run too."""
    steps = ctx.mode.tiny_steps
    digests = _start_tiny_digests(ctx)
    a, b = fresh_runs(ctx, [("a", "tiny", steps), ("b", "tiny", steps)])
    if not (a.done.rc == 0 and b.done.rc == 0):
        raise PhaseFailed("a tiny run failed")
    d = ctx.sh("diff-a-b", cli(ctx, "diff", a.result, b.result))
    ctx.expect("two fresh runs bit-identical (diff)", d.rc == 0, d)
    ctx.expect("their checkpoints byte-identical",
               figures.file_sha256(a.checkpoint) == figures.file_sha256(b.checkpoint))
    v = ctx.sh("verify", cli(ctx, "verify", a.result, "--steps", ctx.mode.verify_tiny_steps,
                             "--directory", ctx.check.streams))
    ctx.expect(f"verify --steps {ctx.mode.verify_tiny_steps}", v.rc == 0, v)
    g = ctx.sh("diff-golden", cli(ctx, "diff", "--across-backends", "--json", a.result, GOLDEN),
               json_out=True)
    gj = g.json() or {}
    ctx.expect("against the interpret golden (diff --across-backends)", g.rc == 0, g)
    ctx.check.outdir.place("tiny-result.bin", a.result)
    ctx.figures.update(
        golden=str(GOLDEN.relative_to(ROOT)), golden_verdict=gj.get("verdict"),
        golden_sections=[{k: s.get(k) for k in ("section", "differing", "beyond_tolerance",
                                                 "max_abs", "max_rel", "first") if k in s}
                         for s in gj.get("sections", [])][:12],
        identity=[r for r in gj.get("identity", []) if r.get("differs")],
        run_seconds=[round(a.done.seconds, 1), round(b.done.seconds, 1)],
        tiny=figures.run_figures(a.result))
    ctx.figures.update(_tiny_digests(ctx, digests))
    return (f"runs {a.done.seconds:.0f}+{b.done.seconds:.0f} s, diff exit {d.rc}, verify exit "
            f"{v.rc}, golden: {gj.get('verdict')}; {_bisect_summary(ctx.figures['bisect'])}")


def _continuation(ctx: Context, ref) -> list:
    """The reference's steps in two fresh processes from one checkpoint; their window checks."""
    m = ctx.mode
    d = ctx.work / "runs" / "production-continuation"
    d.mkdir(parents=True)
    ckpt = d / f"{m.production}.ckpt"
    ckpt.write_bytes(b"")
    first, second = m.continuation
    parts = []
    for i, steps in enumerate((first, second)):
        result = d / f"part-{i + 1}.bin"
        r = ctx.sh(f"continuation-{i + 1}", run_argv(ctx, m.production, steps, ckpt, result))
        if not expect_run(ctx, f"continuation run {i + 1} ({steps} steps)", r, result):
            break
        parts.append(figures.windows_match(ref.result, result, 0 if i == 0 else first))
    ctx.figures["continuation"] = parts
    if len(parts) == 2:
        ctx.expect(f"steps 0–{first - 1} then {first}–{first + second - 1} in a fresh process: "
                   "loss windows bit-identical to the reference's",
                   all(p["bit_identical"] for p in parts), parts)
        if first + second == m.production_steps:
            same = figures.file_sha256(ckpt) == figures.file_sha256(ref.checkpoint)
            ctx.expect("the continued checkpoint equals the reference's", same)
    return parts


def phase_production(ctx: Context) -> str:
    """200 steps: timing from the timestamp table; verify; a continuation in a fresh process.
    verify runs beside the continuation; the runner ends it if the continuation fails first."""
    m = ctx.mode
    ref = fresh_run(ctx, "reference", m.production, m.production_steps)
    if ref.done.rc != 0:
        raise PhaseFailed("the production run failed")
    ctx.figures["run"] = figures.run_figures(ref.result)
    ctx.check.outdir.place("production-result.bin", ref.result)
    # verify (CPU numpy) beside the continuation (its bits matter here, not its timing)
    verify = ctx.start("verify", cli(ctx, "verify", ref.result, "--steps",
                                     m.verify_production_steps, "--directory", ctx.check.streams))
    parts = _continuation(ctx, ref)
    v = ctx.wait(verify)
    ctx.expect(f"verify --steps {m.verify_production_steps}", v.rc == 0, v)
    r = ctx.figures["run"]
    return (f"device {r['device_ms_p50']} ms/update p50 (p90 {r['device_ms_p90']}), host gap "
            f"{r['host_gap_us_p50']} µs p50, f2f {r['fence_to_fence_ms_p50']} ms; continuation "
            + ("bit-identical" if parts and all(p["bit_identical"] for p in parts) else "FAILED"))


def phase_full_run(ctx: Context) -> str:
    """The profile's full run with its publications: steps/s and what each publication stalled."""
    run = fresh_run(ctx, "full", ctx.mode.production)
    if run.done.rc != 0:
        raise PhaseFailed("the full run failed")
    r = figures.run_figures(run.result)
    from coppelius.plan import profiles
    want = profiles.get(ctx.mode.production).publications
    ctx.expect(f"completed with {want} publications",
               r["outcome"] == "completed" and r["publications"] == want, r)
    ctx.figures.update(run=r, **figures.publication_stalls(run.result, run.done.text))
    return (f"{r['steps']} steps at {r['steps_per_s']} steps/s, {r['publications']} publications, "
            f"stall ≤ {ctx.figures.get('stall_ms_max')} ms")


def covered(statuses: dict) -> dict:
    """GPU test id -> the phase of this check that already made its check."""
    return {test: phase for test, phase in COVERED.items() if statuses.get(phase) in RAN}


def per_test_timeout(seconds: float) -> tuple[list, str]:
    """pytest arguments for a per-test timeout, and what they give: pytest-timeout's thread
    method (a hung test ends the session with every thread's stack) where it is installed, else
    pytest's own faulthandler_timeout (the stacks only: the phase's timeout ends it)."""
    if importlib.util.find_spec("pytest_timeout") is not None:
        return (["--timeout", f"{seconds:g}", "--timeout-method", "thread"],
                f"pytest-timeout: {seconds:g} s per test")
    return (["-o", f"faulthandler_timeout={seconds:g}"],
            f"pytest-timeout absent: stacks dumped after {seconds:g} s, the phase's timeout ends "
            "a hung test")


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text(errors="replace"))


def phase_gpu_tests(ctx: Context) -> str:
    """`pytest -m gpu` over the test files that hold GPU tests, less those an earlier phase of
    this check already made, each test under a timeout."""
    files = gpu_test_files()
    ctx.require("test files with GPU tests", bool(files), files)
    statuses = {p["name"]: p["status"] for p in ctx.check.report["phases"]}
    skip = covered(statuses)
    timeout_args, timeout_note = per_test_timeout(ctx.mode.pytest_timeout_s)
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
            "-o", "addopts=-ra", *timeout_args, *files]
    for test in skip:
        argv += ["--deselect", test]
    t = ctx.sh("pytest", argv)
    lines = t.text.strip().splitlines()
    summary = next((x for x in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", x)),
                   "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|"
                                               r"xfailed|xpassed)", summary)}
    ctx.expect("pytest -m gpu", t.rc == 0, t)
    ctx.figures.update(files=files, counts=counts, covered_by_phases=skip,
                       per_test_timeout=timeout_note)
    return summary.strip("= ") or f"exit {t.rc}"


def defined_functions(path: Path) -> set[str]:
    """The test functions a file defines (for the COVERED ids' check)."""
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
