"""The device check's commands in the mode they run in: the CLI, the cuda tools, fresh runs.

A phase builds its commands here, so that each mode's difference lives in one place: the dry
run's cuda-only steps go through tools.gpu_check.fake with triton and torch blocked, its cuda runs
through tools.cpu_cuda (the fake driver executing every launch on the CPU: the same bits as the
interpret golden), and every `coppelius run` and cuda tool waits at most the mode's fence
timeout.  A run that failed and left
a result file is described by `coppelius inspect --json` of it (`forensics`): its outcome, the
error notifier and the last issues, so a FenceTimeout or a device error names itself.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tools.gpu_check.runner import Context, Done

LAST_ISSUES = 4         # timestamp rows of a failed run quoted in the report
FAKE = "tools.gpu_check.fake"       # the dry run's driver: tools/fake_driver.py
CPU_CUDA = "tools.cpu_cuda"         # the dry run's computing driver (tools/cpu_cuda/)


@dataclass
class FreshRun:
    """A `coppelius run` from a fresh checkpoint, kept for phases that need the same one."""
    result: Path
    checkpoint: Path
    done: Done
    phase: str


def cli(ctx: Context, *args, needs_triton: bool = False, computes: bool = False) -> list:
    """`coppelius ARGS`; in the dry run a step that must not need Triton runs with it blocked
    (and the fake driver installed: it is never used by a step that reaches no GPU), and a cuda
    run that `computes` on the executing fake driver (tools.cpu_cuda)."""
    if ctx.mode.fake and computes:
        return [sys.executable, "-m", CPU_CUDA, *args]
    if ctx.mode.fake and not needs_triton:
        return [sys.executable, "-m", FAKE, "--no-triton", "-m", "tools.checkout", *args]
    return [sys.executable, "-m", "tools.checkout", *args]


def cuda_tool(ctx: Context, module: str, *args) -> list:
    """A tool module that opens the cuda backend (the fake driver's in the dry run), its fences
    bounded; run with `-m` from the repository root (the runner's working directory)."""
    fence = ("--fence-timeout", ctx.mode.fence_timeout_s)
    if ctx.mode.fake:
        return [sys.executable, "-m", FAKE, "--no-triton", "-m", module, *args, *fence]
    return [sys.executable, "-m", module, *args, *fence]


def run_argv(ctx: Context, profile: str, steps, checkpoint: Path, result: Path,
             fence_timeout_s: float | None = None) -> list:
    """`coppelius run` of the embedded default on the mode's backend, its fences bounded."""
    backend = ctx.mode.backend
    return cli(ctx, "run", "--profile", profile, "--backend", backend, "--quiet",
               "--steps", steps, "--directory", ctx.check.streams, "--checkpoint", checkpoint,
               "--result", result, "--fence-timeout", fence_timeout_s or ctx.mode.fence_timeout_s,
               needs_triton=backend == "interpret", computes=backend == "cuda")


def forensics(ctx: Context, label: str, result: Path) -> dict | None:
    """What a failed run's result file says (`coppelius inspect --json`): outcome, steps, the
    error notifier, the semaphores and the last issues; None when it left no file."""
    if not result.is_file() or not result.stat().st_size:
        return None
    d = ctx.sh(f"{label}-inspect", cli(ctx, "inspect", "--json", "--stream", "none", result),
               json_out=True)
    j = d.json()
    if not isinstance(j, dict):
        return {"inspect_exit": d.rc, "inspect_log": str(d.log.relative_to(ctx.check.logs))}
    ts = j.get("timestamps", {})
    return {"outcome": j.get("outcome"), "steps_completed": j.get("steps_completed"),
            "issues": j.get("issues"), "error_notifier": j.get("error_notifier"),
            "semaphores": j.get("semaphores"), "warnings": j.get("warnings"),
            "last_issues": {name: col[-LAST_ISSUES:] for name, col in ts.items()}}


def expect_run(ctx: Context, name: str, done: Done, result: Path) -> bool:
    """A run's check; a failed run's result tail goes into the phase's `failed_runs`."""
    ok = ctx.expect(name, done.rc == 0, done)
    if not ok:
        tail = forensics(ctx, done.label, result)
        if tail is not None:
            ctx.figures.setdefault("failed_runs", {})[done.label] = tail
    return ok


def fresh_runs(ctx: Context, specs: list[tuple[str, str, int | None]]) -> list[FreshRun]:
    """Several fresh runs at once, in parallel: the i-th run of a (profile, steps) in the list is
    keyed (profile, backend, steps, i), so two alike in one call are two runs, and a later
    phase's first such run reuses an earlier phase's."""
    from coppelius.plan import profiles
    made_before = set(ctx.check.runs)
    keys, todo, seen = [], {}, {}
    for label, profile, steps in specs:
        what = (profile, ctx.mode.backend, steps or profiles.get(profile).steps)
        key = (*what, seen.get(what, 0))
        seen[what] = key[-1] + 1
        keys.append(key)
        if key not in ctx.check.runs:
            todo[key] = label
    commands, made = [], {}
    for key, label in todo.items():
        profile, _, steps, _ = key
        d = ctx.work / "runs" / f"{ctx.phase}-{label}"
        d.mkdir(parents=True)
        ckpt, result = d / f"{profile}.ckpt", d / "result.bin"
        ckpt.write_bytes(b"")
        commands.append((label, run_argv(ctx, profile, steps, ckpt, result)))
        made[key] = (result, ckpt)
    for (key, label), done in zip(todo.items(), ctx.together(commands)):
        result, ckpt = made[key]
        ctx.check.runs[key] = FreshRun(result, ckpt, done, ctx.phase)
    out = []
    for (label, *_), key in zip(specs, keys):
        run = ctx.check.runs[key]
        if key in made_before:
            ctx.figures.setdefault("reused", {})[label] = f"the run of phase {run.phase}"
        expect_run(ctx, f"run {label}", run.done, run.result)
        out.append(run)
    return out


def fresh_run(ctx: Context, label: str, profile: str, steps: int | None = None) -> FreshRun:
    """`coppelius run` of the embedded default from a fresh checkpoint (reused if made)."""
    return fresh_runs(ctx, [(label, profile, steps)])[0]


def production_run(ctx: Context) -> FreshRun | None:
    """The production phase's reference run, if it was made and succeeded."""
    m = ctx.mode
    run = ctx.check.runs.get((m.production, m.backend, m.production_steps, 0))
    return run if run is not None and run.done.rc == 0 else None
