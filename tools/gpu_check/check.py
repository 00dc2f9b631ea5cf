"""The device check: one budgeted command that turns a GPU machine into every verdict it can.

  bash tools/gpu_check.sh [--budget S] [--out DIR]         # on a GPU machine (OUT defaults to $OUT)
  bash tools/gpu_check.sh --phases a,b --budget 170       # a rerun of the phases that failed
  bash tools/gpu_check.sh --dry-run                       # anywhere: every phase, without a GPU

On a GPU machine the command runs with a wall limit of WALL_S seconds; its default budget
(DEFAULT_BUDGET_S) leaves the HARD_SLACK_S a running phase may overrun it by and EXIT_RESERVE_S for
the start and the last report.  A rerun of failed phases (`--phases`, RERUN_BUDGET_S, wall limit
RERUN_WALL_S) fits in the same DEVICE_TIME_S of machine time with both machines' starts and idle
time counted (`time_plan`; docs/PERFORMANCE.md states it phase by phase).

Phases run in the order of PHASES, what matters most first: the product (doctor, tiny, production,
the full run), then the measurements (per-launch timing, the capture experiments, the calibration
of the cost model's inputs), the sanitizer, the GPU tests the earlier phases did not
already cover, and torch last.  Each has a predicted duration (seconds, per mode: an input, the
budget plan in docs/PERFORMANCE.md, or this CPU's dry run); a phase whose prediction exceeds what
is left of the budget is skipped; a capped phase (Mode.capped_s: torch) starts while its minimum
is left and is stopped at what is left, reporting what it reached.  Every cuda run and tool waits
at most FENCE_TIMEOUT_S for a fence, so a hang costs seconds; the runner is runner.py, $OUT
out.py, the phases phases.py and device.py (this package; `python -m tools.gpu_check` is this
module's `main`, which tools/gpu_check.sh runs).

--dry-run runs the same phases and code paths on a machine without a GPU: the cuda-only steps
(doctor, per-launch timing, the experiments, the calibration) through tools/fake_driver.py (fake.py),
every run on the cuda backend with the tiny profile and few steps through tools.cpu_cuda (the fake
driver executing every launch on the CPU, its memcheck standing in for the sanitizer's: the runs
equal the interpret golden bit for bit), torch on the CPU; the steps that must not need Triton on the GPU
machine (its Triton is not the project's pin) run with triton and torch blocked.  A fresh run is
keyed by what it computes (profile, backend, steps): one already made in an earlier phase is
reused.  `--profile P` / `--tiny-steps N` run GPU mode's production phases on another profile and
the tiny phase on fewer steps (a stand-in driver library that computes nothing, for instance).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from tools.gpu_check import device as D
from tools.gpu_check import phases
from tools.gpu_check.out import MAX_OUT_FILES, OUT_FILES  # noqa: F401  (the check's API)
from tools.gpu_check.runner import (HARD_SLACK_S, Check, Context, Done, Phase, PhaseFailed,  # noqa: F401
                     PhaseTimeout)

FENCE_TIMEOUT_S = 20.0          # every cuda run and tool in the check (a run's default is 120 s)
SANITIZER_FENCE_TIMEOUT_S = 60.0    # under compute-sanitizer a kernel runs many times slower
PYTEST_TIMEOUT_S = 30.0         # per GPU test (pytest-timeout where installed)
# the time plan: one command, then a rerun of what failed on a fresh machine, in one task's time
DEVICE_TIME_S = 900.0           # a task's machine time: starts, commands and idle time
MACHINE_START_S = 120.0         # a machine's start, at worst
IDLE_AFTER_S = 30.0             # a machine stays held this long after a command
WALL_S = 360.0                  # the command's wall limit
RERUN_WALL_S = 210.0            # the rerun's wall limit
EXIT_RESERVE_S = 10.0           # Python's start, the machine's description, the last report
DEFAULT_BUDGET_S = {"gpu": WALL_S - HARD_SLACK_S - EXIT_RESERVE_S, "dry-run": 900.0}
RERUN_BUDGET_S = RERUN_WALL_S - HARD_SLACK_S - EXIT_RESERVE_S


def time_plan() -> dict:
    """Machine time of the command and a rerun on a fresh machine, each start and idle counted."""
    first = MACHINE_START_S + WALL_S + IDLE_AFTER_S
    rerun = MACHINE_START_S + RERUN_WALL_S + IDLE_AFTER_S
    return {"first_s": first, "rerun_s": rerun, "total_s": first + rerun,
            "device_time_s": DEVICE_TIME_S, "fits": first + rerun <= DEVICE_TIME_S}


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
    fake: bool                      # cuda-only steps through tools/fake_driver.py
    predicted_s: dict               # phase name -> predicted seconds in this mode
    timeout_factor: float           # a phase's timeout: factor × predicted + extra (a safety net)
    timeout_extra_s: float
    capped_s: dict                  # capped phase -> the seconds it starts with
    sanitizer_steps: int            # tiny steps under memcheck
    tiny_steps: int | None = None   # the tiny phase's runs (None: the profile's)
    fence_timeout_s: float = FENCE_TIMEOUT_S
    sanitizer_fence_timeout_s: float = SANITIZER_FENCE_TIMEOUT_S
    pytest_timeout_s: float = PYTEST_TIMEOUT_S


# H200 predictions (docs/PERFORMANCE.md, "The device check: its time plan", counts each one).
GPU = Mode("gpu", backend="cuda", production="coppelius", production_steps=200,
           continuation=(100, 100), verify_tiny_steps=8, verify_production_steps=2,
           launch_repeats=30, bench_steps=200, bench_warmup=10, torch_device="cuda",
           compile_backend="inductor", fake=False, timeout_factor=2.0, timeout_extra_s=30.0,
           capped_s={"torch": 30, "torch-default": 30}, sanitizer_steps=2,
           predicted_s={"doctor": 15, "tiny": 35, "production": 45, "full-run": 50,
                        "per-launch": 15, "experiments": 15, "calibration": 15, "sanitizer": 45,
                        "gpu-tests": 15, "torch": 90, "torch-default": 45})
# An idle 2-core CPU, measured (docs/PERFORMANCE.md): the interpreter's ~10 s per tiny step
# dominates.  A shared CPU runs it several times slower, hence the wide timeouts: a dry run is for
# executing every step, not for its timing.
DRY = Mode("dry-run", backend="cuda", production="tiny", production_steps=8,
           continuation=(1, 1), verify_tiny_steps=8, verify_production_steps=2,
           launch_repeats=3, bench_steps=3, bench_warmup=1, torch_device="cpu",
           compile_backend="aot_eager", fake=True, timeout_factor=5.0, timeout_extra_s=120.0,
           capped_s={"torch": 20, "torch-default": 20}, sanitizer_steps=1,
           predicted_s={"doctor": 6, "tiny": 180, "production": 60, "full-run": 3,
                        "per-launch": 8, "experiments": 8, "calibration": 4, "sanitizer": 40,
                        "gpu-tests": 20, "torch": 50, "torch-default": 35})


def for_profile(mode: Mode, profile: str | None, tiny_steps: int | None) -> Mode:
    """`mode` with its production phases on `profile` (their steps cut to the profile's, the
    continuation its two halves) and the tiny phase's runs on `tiny_steps`."""
    from coppelius.plan import profiles
    out = mode
    if profile is not None and profile != mode.production:
        n = min(mode.production_steps, profiles.get(profile).steps)
        out = dataclasses.replace(out, production=profile, production_steps=n,
                                  continuation=(n // 2, n - n // 2))
    if tiny_steps is not None:
        out = dataclasses.replace(out, tiny_steps=tiny_steps)
    return out


PHASES = [
    Phase("doctor", "1. doctor: driver, device, target, every module as the driver reports it",
          phases.phase_doctor),
    Phase("tiny", "2. tiny on cuda: two runs bit-identical, verify, the interpret golden, its digests bisected",
          phases.phase_tiny),
    Phase("production", "3. production: 200 steps timed, verify, a continuation",
          phases.phase_production),
    Phase("full-run", "4. the full production run with its publications", phases.phase_full_run),
    Phase("per-launch", "5. per-launch timing beside the cost model, graph vs launches",
          D.phase_per_launch),
    Phase("experiments", "6. experiments: edges, lanes, the side lane (graph replays)",
          D.phase_experiments),
    Phase("calibration", "7. calibration: L2 bandwidth, latencies, launch cost, co-resident CTAs "
          "beside the cost model's inputs", D.phase_calibration),
    Phase("sanitizer", "8. compute-sanitizer: memcheck of tiny steps, racecheck of attention "
          "and weight gradients", D.phase_sanitizer),
    Phase("gpu-tests", "9. pytest -m gpu (what the phases before did not cover)",
          phases.phase_gpu_tests),
    Phase("torch", "10. PyTorch eager and reduce-overhead side by side (capped)", D.phase_torch),
    Phase("torch-default", "11. torch.compile default mode (capped)", D.phase_torch_default),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bash tools/gpu_check.sh", description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="every phase without a GPU: the fake driver (executing on the CPU), "
                    "torch on CPU")
    ap.add_argument("--budget", type=float, help=f"seconds for all phases (default: "
                    f"{DEFAULT_BUDGET_S['gpu']:.0f} on a GPU, {DEFAULT_BUDGET_S['dry-run']:.0f} "
                    f"for the dry run; a rerun: {RERUN_BUDGET_S:.0f})")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or
                                                     "/tmp/coppelius-gpu-check"),
                    help="where report.md, report.json, logs.tar.gz go (default $OUT)")
    ap.add_argument("--phases", help="comma-separated: run only these (the rest are skipped)")
    ap.add_argument("--profile", help="GPU mode: the production phases' profile (default "
                    f"{GPU.production})")
    ap.add_argument("--tiny-steps", type=int, help="GPU mode: steps of the tiny phase's runs")
    a = ap.parse_args(argv)
    mode = DRY if a.dry_run else GPU
    if a.dry_run and (a.profile or a.tiny_steps):
        ap.error("--profile and --tiny-steps are for GPU mode (the dry run is tiny already)")
    if a.tiny_steps is not None and a.tiny_steps < 1:
        ap.error(f"--tiny-steps must be at least 1, got {a.tiny_steps}")
    if a.profile is not None:
        from coppelius.plan import profiles
        if a.profile not in profiles.names():
            ap.error(f"unknown profile {a.profile!r}: one of {', '.join(profiles.names())}")
    mode = for_profile(mode, a.profile, a.tiny_steps)
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

