"""The device check: one budgeted command that turns a lent GPU machine into a complete verdict.

  bash tools/gpu_check.sh [--budget S] [--out DIR]     # on the GPU machine (OUT defaults to $OUT)
  bash tools/gpu_check.sh --dry-run                     # anywhere: every phase, without a GPU

Phases run in priority order (PHASES).  Each has a predicted duration (seconds, per mode: the GPU
budget plan in docs/PERFORMANCE.md, or this CPU's dry run); a phase whose prediction exceeds what
is left of the budget is skipped and reported as skipped, never started and killed half-way.  A
per-phase timeout (a safety net: Mode.timeout_factor × the prediction + timeout_extra_s, never past
the budget + HARD_SLACK_S) kills its process group and reports "failed: timeout".  After every phase
$OUT/report.json, $OUT/report.md and $OUT/logs.tar.gz are rewritten, so a check stopped from
outside still leaves what it found; at most MAX_OUT_FILES files ever lie in $OUT (OUT_FILES).

--dry-run runs the same phases and code paths on a machine without a GPU: the cuda-only steps
(doctor, per-launch timing) through tests/fake_driver.py (tools/gpu_check_fake.py), every run on
the interpret backend with the tiny profile and few steps, torch on the CPU; the steps that must
not need Triton on the GPU machine (its Triton is not the project's pin) run with triton and torch
blocked.  A fresh run is keyed by what it computes (profile, backend, steps): one already made in
an earlier phase is reused, not made again (on the GPU no two phases share one; in the dry run the
tiny profile's full run serves the tiny, production and full-run phases).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import gpu_check_figures as F  # noqa: E402
from gpu_check_report import GOLDEN, fmt, machine_info, report_markdown, summary_table  # noqa: E402

DEFAULT_BUDGET_S = {"gpu": 300.0, "dry-run": 900.0}
HARD_SLACK_S = 60.0          # a phase may overrun the budget by this much before it is killed
MAX_OUT_FILES = 8            # what the device tool brings back from $OUT
OUT_FILES = ("report.md", "report.json", "logs.tar.gz", "per_launch.json", "bench.json",
             "tiny-result.bin", "production-result.bin")
LOG_TAIL = 4000              # characters of a failing command's output quoted in the report


@dataclass(frozen=True)
class Mode:
    """What the phases run: the GPU check or its dry run (the same steps, smaller and faked)."""
    name: str
    backend: str                    # runs: cuda | interpret
    production: str                 # the profile of the production phases
    production_steps: int           # the production phase's reference run
    continuation: tuple[int, int]   # steps of the two continuation runs
    verify_tiny_steps: int
    verify_production_steps: int
    launch_repeats: int
    bench_steps: int
    bench_warmup: int
    torch_device: str
    compile_backend: str
    fake: bool                      # cuda-only steps through tests/fake_driver.py
    predicted_s: dict               # phase name -> predicted seconds in this mode
    timeout_factor: float           # a phase's timeout: factor × predicted + extra (a safety net)
    timeout_extra_s: float


# H200 predictions (docs/PERFORMANCE.md, "Issue 12 — the device check", counts each one).
GPU = Mode("gpu", backend="cuda", production="coppelius", production_steps=200,
           continuation=(100, 100), verify_tiny_steps=8, verify_production_steps=2,
           launch_repeats=30, bench_steps=200, bench_warmup=10, torch_device="cuda",
           compile_backend="inductor", fake=False, timeout_factor=2.0, timeout_extra_s=30.0,
           predicted_s={"doctor": 15, "tiny": 25, "gpu-tests": 20, "production": 45,
                        "per-launch": 15, "torch": 90, "full-run": 50, "torch-default": 45})
# An idle 2-core CPU, measured (docs/PERFORMANCE.md): the interpreter's ~10 s per tiny step
# dominates.  A shared CPU runs it several times slower, hence the wide timeouts: a dry run is for
# executing every step, not for its timing.
DRY = Mode("dry-run", backend="interpret", production="tiny", production_steps=8,
           continuation=(1, 1), verify_tiny_steps=8, verify_production_steps=2,
           launch_repeats=3, bench_steps=3, bench_warmup=1, torch_device="cpu",
           compile_backend="aot_eager", fake=True, timeout_factor=5.0, timeout_extra_s=120.0,
           predicted_s={"doctor": 6, "tiny": 120, "gpu-tests": 20, "production": 60,
                        "per-launch": 8, "torch": 50, "full-run": 3, "torch-default": 35})


class PhaseFailed(Exception):
    """A phase's check did not hold; `figures` keeps what it measured before."""


class PhaseTimeout(Exception):
    pass


class Interrupted(BaseException):      # not an Exception: no phase's `except` may swallow it
    """SIGTERM or SIGINT reached the check: the phase in flight is reported failed, the rest
    skipped, the report written."""


def kill_group(proc: subprocess.Popen) -> None:
    """A command's own process group, by its id, and the command reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Done:
    """A finished command: its exit code, its log (stderr, and stdout unless kept apart)."""
    label: str
    rc: int
    seconds: float
    log: Path
    stdout: Path | None = None      # where stdout went when kept apart (a JSON-printing command)

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def json(self):
        """The command's stdout as JSON, or None when it printed none."""
        try:
            return json.loads(self.stdout.read_text())
        except (OSError, ValueError, AttributeError):
            return None


@dataclass
class Started:
    label: str
    proc: subprocess.Popen
    log: Path
    t0: float
    stdout: Path | None = None


@dataclass
class FreshRun:
    """A `coppelius run` from a fresh checkpoint, kept for phases that need the same one."""
    result: Path
    checkpoint: Path
    done: Done
    phase: str


class Context:
    """What a phase body uses: commands under its deadline, logged under logs/<phase>/."""

    def __init__(self, check: "Check", phase: str, deadline: float):
        self.check, self.mode, self.phase, self.deadline = check, check.mode, phase, deadline
        self.work, self.out = check.work, check.out
        self.logs = check.logs / phase
        self.logs.mkdir(parents=True, exist_ok=True)
        self.figures: dict = {}
        self.checks: list[dict] = []

    # ---- commands
    def start(self, label: str, argv: list, env: dict | None = None,
              json_out: bool = False) -> Started:
        """Start a command in a process group of its own (in this session, so that whatever ends
        the check from outside ends it too); stdout apart (logs/…/LABEL.json) if json_out."""
        log = self.logs / f"{label}.log"
        stdout = self.logs / f"{label}.json" if json_out else None
        with open(log, "w") as f:
            f.write("$ " + " ".join(map(str, argv)) + "\n")
            f.flush()
            out = open(stdout, "w") if stdout else f
            try:
                proc = subprocess.Popen([str(a) for a in argv], cwd=ROOT, stdout=out,
                                        stderr=f if stdout else subprocess.STDOUT,
                                        process_group=0, env={**self.check.env, **(env or {})})
            finally:
                if stdout:
                    out.close()
        self.check.live.add(proc)
        return Started(label, proc, log, time.monotonic(), stdout)

    def wait(self, s: Started) -> Done:
        try:
            rc = s.proc.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill(s)
            raise PhaseTimeout(f"{s.label} still running at the phase's timeout") from None
        self.check.live.discard(s.proc)
        seconds = time.monotonic() - s.t0
        with open(s.log, "a") as f:
            f.write(f"\n[exit {rc} after {seconds:.1f} s]\n")
        return Done(s.label, rc, seconds, s.log, s.stdout)

    def kill(self, s: Started) -> None:
        kill_group(s.proc)
        self.check.live.discard(s.proc)

    def sh(self, label: str, argv: list, env: dict | None = None, json_out: bool = False) -> Done:
        return self.wait(self.start(label, argv, env, json_out))

    def together(self, commands: list[tuple[str, list]]) -> list[Done]:
        started = [self.start(label, argv) for label, argv in commands]
        try:
            return [self.wait(s) for s in started]
        except PhaseTimeout:
            for s in started:
                self.kill(s)
            raise

    # ---- what the commands are in this mode
    def cli(self, *args, needs_triton: bool = False) -> list:
        """`coppelius ARGS`; in the dry run a step that must not need Triton runs with it blocked
        (and the fake driver installed: it is never used by a step that reaches no GPU)."""
        if self.mode.fake and not needs_triton:
            return [sys.executable, "tools/gpu_check_fake.py", "--no-triton", "-m", "host.cli", *args]
        return [sys.executable, "-m", "host.cli", *args]

    def cuda_tool(self, script: str, *args) -> list:
        """A tools/ script that opens the cuda backend (the fake driver's in the dry run)."""
        if self.mode.fake:
            return [sys.executable, "tools/gpu_check_fake.py", "--no-triton", script, *args]
        return [sys.executable, script, *args]

    def fresh_run(self, label: str, profile: str, steps: int | None = None) -> FreshRun:
        """`coppelius run` of the embedded default from a fresh checkpoint (reused if made)."""
        return self.fresh_runs([(label, profile, steps)])[0]

    def fresh_runs(self, specs: list[tuple[str, str, int | None]]) -> list[FreshRun]:
        """Several fresh runs at once, in parallel: the i-th run of a (profile, steps) in the
        list is keyed (profile, backend, steps, i), so two alike in one call are two runs, and a
        later phase's first such run reuses an earlier phase's."""
        from plan import profiles
        made_before = set(self.check.runs)
        keys, todo, seen = [], {}, {}
        for label, profile, steps in specs:
            what = (profile, self.mode.backend, steps or profiles.get(profile).steps)
            key = (*what, seen.get(what, 0))
            seen[what] = key[-1] + 1
            keys.append(key)
            if key not in self.check.runs:
                todo[key] = label
        commands, made = [], {}
        for key, label in todo.items():
            profile, backend, steps, _ = key
            d = self.work / "runs" / f"{self.phase}-{label}"
            d.mkdir(parents=True)
            ckpt, result = d / f"{profile}.ckpt", d / "result.bin"
            ckpt.write_bytes(b"")
            argv = self.cli("run", "--profile", profile, "--backend", backend, "--quiet",
                            "--steps", steps, "--directory", self.check.streams,
                            "--checkpoint", ckpt, "--result", result,
                            needs_triton=backend == "interpret")
            commands.append((label, argv))
            made[key] = (result, ckpt)
        for (key, label), done in zip(todo.items(), self.together(commands)):
            result, ckpt = made[key]
            self.check.runs[key] = FreshRun(result, ckpt, done, self.phase)
        out = []
        for (label, *_), key in zip(specs, keys):
            run = self.check.runs[key]
            if key in made_before:
                self.figures.setdefault("reused", {})[label] = f"the run of phase {run.phase}"
            self.expect(f"run {label}", run.done.rc == 0, run.done)
            out.append(run)
        return out

    # ---- verdicts
    def expect(self, name: str, ok: bool, detail=None) -> bool:
        """Record one check; a Done's output tail is kept when it failed."""
        row = {"check": name, "ok": bool(ok)}
        if isinstance(detail, Done):
            row.update(rc=detail.rc, seconds=round(detail.seconds, 2),
                       log=str(detail.log.relative_to(self.check.logs)))
            if not ok:
                row["tail"] = detail.text[-LOG_TAIL:]
        elif detail is not None:
            row["detail"] = detail
        self.checks.append(row)
        return bool(ok)

    def require(self, name: str, ok: bool, detail=None) -> None:
        """A check the rest of the phase depends on."""
        if not self.expect(name, ok, detail):
            raise PhaseFailed(f"{name} failed")


@dataclass
class Phase:
    name: str
    title: str
    body: object                    # (Context) -> one-line summary for the table


class Check:
    def __init__(self, mode: Mode, out: Path, budget: float, only: list[str] | None = None):
        self.mode, self.out, self.budget, self.only = mode, out, budget, only
        self.work = Path(tempfile.mkdtemp(prefix="coppelius-gpu-check-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.streams = self.work / "streams"
        self.runs: dict = {}
        self.live: set = set()              # commands running now
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                        "PYTHONPATH", "").split(os.pathsep) if p]),
                    # one fresh compute cache for the check: a process JITs what no earlier one did
                    "CUDA_CACHE_PATH": str(self.work / "cuda-cache")}
        self.env.pop("CUDA_CACHE_DISABLE", None)
        out.mkdir(parents=True, exist_ok=True)
        self.report = {"mode": mode.name, "budget_s": budget,
                       "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "machine": machine_info(), "phases": [], "elapsed_s": 0.0}
        self.t0 = time.monotonic()          # the budget counts the phases, from here

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def run(self, phases: list[Phase]) -> int:
        def interrupt(signum, frame):
            raise Interrupted(signal.Signals(signum).name)
        old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for i, phase in enumerate(phases):
                try:
                    self.run_phase(phase)
                except Interrupted as e:
                    for proc in list(self.live):
                        kill_group(proc)
                    self.report["phases"][-1].update(status="failed", reason=f"interrupted ({e})")
                    for rest in phases[i + 1:]:
                        self.report["phases"].append(
                            {"name": rest.name, "title": rest.title, "status": "skipped",
                             "predicted_s": float(self.mode.predicted_s[rest.name]),
                             "seconds": 0.0, "reason": f"the check was interrupted ({e})"})
                    break
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.write()
            shutil.rmtree(self.work, ignore_errors=True)
        print(summary_table(self.report))
        return 1 if any(p["status"] == "failed" for p in self.report["phases"]) else 0

    def run_phase(self, phase: Phase) -> None:
        predicted = float(self.mode.predicted_s[phase.name])
        entry = {"name": phase.name, "title": phase.title, "status": "running",
                 "predicted_s": predicted, "seconds": 0.0}
        self.report["phases"].append(entry)
        left = self.left()
        if self.only is not None and phase.name not in self.only:
            entry.update(status="skipped", reason="not asked for (--phases)")
        elif predicted > left:
            entry.update(status="skipped", reason=f"predicted {predicted:.0f} s, "
                         f"{max(left, 0):.0f} s of the budget left")
        else:
            self.write()                        # a check killed from outside shows what ran
            timeout = min(self.mode.timeout_factor * predicted + self.mode.timeout_extra_s,
                          left + HARD_SLACK_S)
            entry["timeout_s"] = round(timeout, 1)
            ctx = Context(self, phase.name, time.monotonic() + timeout)
            t = time.monotonic()
            try:
                entry["summary"] = phase.body(ctx)
                failed = [c["check"] for c in ctx.checks if not c["ok"]]
                entry["status"] = "failed" if failed else "ok"
                if failed:
                    entry["reason"] = "failed: " + ", ".join(failed)
            except PhaseTimeout as e:
                entry.update(status="failed", reason=f"failed: timeout ({e})")
            except PhaseFailed as e:
                entry.update(status="failed", reason=str(e))
            except Exception as e:      # a bug in the check itself: reported, the rest still runs
                (ctx.logs / "check-error.log").write_text(traceback.format_exc())
                entry.update(status="failed", reason=f"check error: {type(e).__name__}: {e}")
            entry["seconds"] = round(time.monotonic() - t, 3)
            entry["checks"] = ctx.checks
            entry.update(ctx.figures)
        self.write()

    # ---- $OUT
    def write(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.t0, 2)
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str,
                                                         ensure_ascii=False))
        (self.out / "report.md").write_text(report_markdown(self.report))
        tmp = self.out / ".logs.tar.gz.partial"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        tmp.replace(self.out / "logs.tar.gz")
        files = [p for p in self.out.rglob("*") if p.is_file()]
        unknown = [p.name for p in files if p.name not in OUT_FILES]
        if len(files) > MAX_OUT_FILES or unknown:
            raise RuntimeError(f"$OUT holds {len(files)} files ({', '.join(sorted(unknown))} "
                               f"unexpected): at most {MAX_OUT_FILES} come back")


# ================================================================ phases

def phase_doctor(ctx: Context) -> str:
    """`coppelius doctor --json` with the compute cache off, so every module's JIT log is real."""
    profile = ctx.mode.production
    done = ctx.sh("doctor", ctx.cli("doctor", "--profile", profile, "--json"),
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


def phase_tiny(ctx: Context) -> str:
    """Two fresh tiny runs bit-identical; verify against numpy; against the interpret golden."""
    a, b = ctx.fresh_runs([("a", "tiny", None), ("b", "tiny", None)])
    if not (a.done.rc == 0 and b.done.rc == 0):
        raise PhaseFailed("a tiny run failed")
    d = ctx.sh("diff-a-b", ctx.cli("diff", a.result, b.result))
    ctx.expect("two fresh runs bit-identical (diff)", d.rc == 0, d)
    v = ctx.sh("verify", ctx.cli("verify", a.result, "--steps", ctx.mode.verify_tiny_steps,
                                 "--directory", ctx.check.streams))
    ctx.expect(f"verify --steps {ctx.mode.verify_tiny_steps}", v.rc == 0, v)
    g = ctx.sh("diff-golden", ctx.cli("diff", "--across-backends", "--json", a.result, GOLDEN),
               json_out=True)
    gj = g.json() or {}
    ctx.expect("against the interpret golden (diff --across-backends)", g.rc == 0, g)
    shutil.copyfile(a.result, ctx.out / "tiny-result.bin")
    ctx.figures.update(
        golden=str(GOLDEN.relative_to(ROOT)), golden_verdict=gj.get("verdict"),
        golden_sections=[{k: s.get(k) for k in ("section", "differing", "beyond_tolerance",
                                                 "max_abs", "max_rel", "first") if k in s}
                         for s in gj.get("sections", [])][:12],
        identity=[r for r in gj.get("identity", []) if r.get("differs")],
        run_seconds=[round(a.done.seconds, 1), round(b.done.seconds, 1)],
        tiny=F.run_figures(a.result))
    return (f"runs {a.done.seconds:.0f}+{b.done.seconds:.0f} s, diff exit {d.rc}, verify exit "
            f"{v.rc}, golden: {gj.get('verdict')}")


def phase_gpu_tests(ctx: Context) -> str:
    """`pytest -m gpu` over the test files that hold GPU tests."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "pytest.mark.gpu" in p.read_text(errors="replace"))
    ctx.require("test files with GPU tests", bool(files), files)
    t = ctx.sh("pytest", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                          "no:cacheprovider", "-o", "addopts=-ra", *files])
    lines = t.text.strip().splitlines()
    summary = next((x for x in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", x)),
                   "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|"
                                               r"xfailed|xpassed)", summary)}
    ctx.expect("pytest -m gpu", t.rc == 0, t)
    ctx.figures.update(files=files, counts=counts)
    return summary.strip("= ") or f"exit {t.rc}"


def phase_production(ctx: Context) -> str:
    """200 steps: timing from the timestamp table; verify; a continuation in a fresh process."""
    m = ctx.mode
    ref = ctx.fresh_run("reference", m.production, m.production_steps)
    if ref.done.rc != 0:
        raise PhaseFailed("the production run failed")
    ctx.figures["run"] = F.run_figures(ref.result)
    shutil.copyfile(ref.result, ctx.out / "production-result.bin")
    # verify (CPU numpy) beside the continuation (its bits matter here, not its timing)
    verify = ctx.start("verify", ctx.cli("verify", ref.result, "--steps", m.verify_production_steps,
                                         "--directory", ctx.check.streams))
    d = ctx.work / "runs" / "production-continuation"
    d.mkdir(parents=True)
    ckpt = d / f"{m.production}.ckpt"
    ckpt.write_bytes(b"")
    first, second = m.continuation
    parts = []
    for i, steps in enumerate((first, second)):
        result = d / f"part-{i + 1}.bin"
        r = ctx.sh(f"continuation-{i + 1}", ctx.cli(
            "run", "--profile", m.production, "--backend", m.backend, "--quiet", "--steps", steps,
            "--directory", ctx.check.streams, "--checkpoint", ckpt, "--result", result,
            needs_triton=m.backend == "interpret"))
        if not ctx.expect(f"continuation run {i + 1} ({steps} steps)", r.rc == 0, r):
            break
        parts.append(F.windows_match(ref.result, result, 0 if i == 0 else first))
    ctx.figures["continuation"] = parts
    if len(parts) == 2:
        ctx.expect(f"steps 0–{first - 1} then {first}–{first + second - 1} in a fresh process: "
                   "loss windows bit-identical to the reference's",
                   all(p["bit_identical"] for p in parts), parts)
        if first + second == m.production_steps:
            same = F.file_sha256(ckpt) == F.file_sha256(ref.checkpoint)
            ctx.expect("the continued checkpoint equals the reference's", same)
    v = ctx.wait(verify)
    ctx.expect(f"verify --steps {m.verify_production_steps}", v.rc == 0, v)
    r = ctx.figures["run"]
    return (f"device {r['device_ms_p50']} ms/update p50 (p90 {r['device_ms_p90']}), host gap "
            f"{r['host_gap_us_p50']} µs p50, f2f {r['fence_to_fence_ms_p50']} ms; continuation "
            + ("bit-identical" if parts and all(p["bit_identical"] for p in parts) else "FAILED"))


def phase_per_launch(ctx: Context) -> str:
    """The update's launches one by one outside the graph, each between events, and the graph."""
    m = ctx.mode
    ref = ctx.check.runs.get((m.production, m.backend, m.production_steps, 0))
    args = ["--profile", m.production, "--repeats", m.launch_repeats,
            "--directory", ctx.check.streams, "--json", ctx.out / "per_launch.json",
            "--summary", ctx.logs / "summary.json", "--table", ctx.logs / "model-vs-measured.md"]
    if ref is not None and ref.done.rc == 0:
        args += ["--checkpoint", ref.checkpoint]       # trained weights, not only the init
    t = ctx.sh("per-launch", ctx.cuda_tool("tools/gpu_check_launches.py", *args))
    ctx.require("per-launch timing", t.rc == 0, t)
    s = json.loads((ctx.logs / "summary.json").read_text())
    ctx.figures.update(s)
    ctx.expect("every launch timed", s["launches"] > 0 and s["repeats"] == m.launch_repeats)
    ctx.expect("the graph recaptured with every edge full was timed",
               s["full_edges_graph_us_p50"] is not None)
    ctx.expect("the driver took the programmatic edges", not s.get("programmatic_refused"),
               s.get("programmatic_refused"))
    pred = (s.get("predicted_update_us") or {}).get("central")
    full = (s.get("predicted_full_edges_update_us") or {}).get("central")
    return (f"{s['launches']} launches: sum {s['sum_of_launches_us']:.0f} µs, graph "
            f"{s['graph_us_p50']:.0f} µs ({s['programmatic_edges']} programmatic edges; all full "
            f"{s['full_edges_graph_us_p50']:.0f} µs), model {pred and round(pred)} µs central "
            f"(all full {full and round(full)}), {s['starved_repeats']} starved")


def _bench(ctx: Context, label: str, variants: str) -> dict:
    m = ctx.mode
    ref = ctx.check.runs.get((m.production, m.backend, m.production_steps, 0))
    args = ["--steps", m.bench_steps, "--warmup", m.bench_warmup, "--device", m.torch_device,
            "--variants", variants, "--compile-backend", m.compile_backend,
            "--directory", ctx.check.streams, "--json", ctx.logs / f"{label}.json"]
    if ref is not None and ref.done.rc == 0:
        args += ["--result", ref.result]                # the production phase's Coppelius run
    else:
        args += ["--profile", m.production, "--backend", m.backend]
    t = ctx.sh(label, [sys.executable, "tools/bench_torch.py", *args])
    path = ctx.logs / f"{label}.json"
    ctx.require(f"bench_torch {variants}", path.exists(), t)
    j = json.loads(path.read_text())
    ctx.expect(f"loss agreement ≤ {j['agreement_atol']:g} over the first {j['agree_steps']} steps",
               t.rc == 0, t)
    bench = ctx.out / "bench.json"
    merged = json.loads(bench.read_text()) if bench.exists() else {**j, "rows": j["rows"][:1]}
    merged["rows"] += j["rows"][1:]
    merged["agreement"] = {**merged.get("agreement", {}), **j["agreement"]}
    bench.write_text(json.dumps(merged, indent=1))
    rows = [{k: r.get(k) for k in ("what", "ms_p50", "device_ms_p50", "ratio", "device_ratio",
                                   "compile_s", "agreement")} for r in j["rows"]]
    ctx.figures.update(rows=rows, timing=j["timing"], steps=j["steps"], warmup=j["warmup"],
                       coppelius_source=j["coppelius"]["source"])
    return "; ".join(f"{r['what']} {fmt(r['ms_p50'])} ms (×{fmt(r['ratio'], '.2f')})"
                     for r in rows)


def phase_torch(ctx: Context) -> str:
    """PyTorch eager and torch.compile(mode="reduce-overhead") beside Coppelius."""
    return _bench(ctx, "bench", "eager,reduce-overhead")


def phase_torch_default(ctx: Context) -> str:
    """torch.compile's default mode, only when the budget still holds it."""
    return _bench(ctx, "bench-default", "default")


def phase_full_run(ctx: Context) -> str:
    """The profile's full run with its publications: steps/s and what each publication stalled."""
    run = ctx.fresh_run("full", ctx.mode.production)
    if run.done.rc != 0:
        raise PhaseFailed("the full run failed")
    r = F.run_figures(run.result)
    from plan import profiles
    want = profiles.get(ctx.mode.production).publications
    ctx.expect(f"completed with {want} publications",
               r["outcome"] == "completed" and r["publications"] == want, r)
    ctx.figures.update(run=r, **F.publication_stalls(run.result, run.done.text))
    return (f"{r['steps']} steps at {r['steps_per_s']} steps/s, {r['publications']} publications, "
            f"stall ≤ {ctx.figures.get('stall_ms_max')} ms")


PHASES = [
    Phase("doctor", "1. doctor: driver, device, target, every module as the driver reports it",
          phase_doctor),
    Phase("tiny", "2. tiny on cuda: two runs bit-identical, verify, the interpret golden",
          phase_tiny),
    Phase("gpu-tests", "3. pytest -m gpu", phase_gpu_tests),
    Phase("production", "4. production: 200 steps timed, verify, a continuation", phase_production),
    Phase("per-launch", "5. per-launch timing beside the cost model, graph vs launches",
          phase_per_launch),
    Phase("torch", "6. PyTorch eager and reduce-overhead side by side", phase_torch),
    Phase("full-run", "7. the full production run with its publications", phase_full_run),
    Phase("torch-default", "6b. torch.compile default mode (only if the budget remains)",
          phase_torch_default),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="every phase without a GPU: fake driver, interpret backend, torch on CPU")
    ap.add_argument("--budget", type=float, help="seconds for all phases (default: 300 on a GPU, "
                    "900 for the dry run)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or
                                                     "/tmp/coppelius-gpu-check"),
                    help="where report.md, report.json, logs.tar.gz go (default $OUT)")
    ap.add_argument("--phases", help="comma-separated: run only these (the rest are skipped)")
    a = ap.parse_args(argv)
    mode = DRY if a.dry_run else GPU
    budget = a.budget if a.budget is not None else DEFAULT_BUDGET_S[mode.name]
    only = None
    if a.phases:
        only = [x for x in a.phases.split(",") if x]
        unknown = sorted(set(only) - {p.name for p in PHASES})
        if unknown:
            ap.error(f"unknown phase(s) {', '.join(unknown)}: {', '.join(p.name for p in PHASES)}")
    stale = [p for p in a.out.glob("*") if p.name in OUT_FILES]
    for p in stale:                 # a rerun into the same folder starts clean
        p.unlink()
    return Check(mode, a.out, budget, only).run(PHASES)


if __name__ == "__main__":
    sys.exit(main())
