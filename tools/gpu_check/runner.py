"""The device check's runner: phases under one budget, each command in its own process group.

`Check.run(phases)` runs phases in order: a phase whose prediction exceeds what is left of the
budget is skipped (never started and killed half-way), except a capped phase (`Mode.capped_s`),
which starts while at least its minimum is left and is stopped at what is left; a phase's timeout kills its commands
and reports "failed: timeout"; every process a phase started is ended when the phase ends,
whatever its outcome.  After every phase $OUT (out.OutDir) is rewritten.  A phase body
gets a `Context`: commands under its deadline, logged under logs/<phase>/, and its verdicts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tools.gpu_check.out import OutDir
from tools.gpu_check.report import machine_info, summary_table

ROOT = Path(__file__).resolve().parents[2]
HARD_SLACK_S = 30.0          # a phase may overrun the budget by this much before it is killed
LOG_TAIL = 4000              # characters of a failing command's output quoted in the report


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
class Phase:
    name: str
    title: str
    body: object                    # (Context) -> one-line summary for the table


class Context:
    """What a phase body uses: commands under its deadline, logged under logs/<phase>/."""

    def __init__(self, check: "Check", phase: str, deadline: float):
        self.check, self.mode, self.phase, self.deadline = check, check.mode, phase, deadline
        self.work, self.out = check.work, check.out
        self.logs = check.logs / phase
        self.logs.mkdir(parents=True, exist_ok=True)
        self.figures: dict = {}
        self.checks: list[dict] = []
        self.started: list[subprocess.Popen] = []

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
        self.started.append(proc)
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

    def end_all(self) -> list[int]:
        """End every command this phase started that still runs; their pids."""
        ended = []
        for proc in self.started:
            if proc.poll() is None:
                ended.append(proc.pid)
            kill_group(proc)                    # a finished leader may leave its group behind
            self.check.live.discard(proc)
        return ended

    def sh(self, label: str, argv: list, env: dict | None = None, json_out: bool = False) -> Done:
        return self.wait(self.start(label, argv, env, json_out))

    def together(self, commands: list[tuple[str, list]]) -> list[Done]:
        started = [self.start(label, argv) for label, argv in commands]
        return [self.wait(s) for s in started]      # a timeout: end_all ends the rest

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


class Check:
    def __init__(self, mode, out: Path, budget: float, only: list[str] | None = None):
        self.mode, self.out, self.budget, self.only = mode, out, budget, only
        self.work = Path(tempfile.mkdtemp(prefix="coppelius-gpu-check-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.streams = self.work / "streams"
        self.runs: dict = {}
        self.shared: dict = {}              # what a phase leaves for later ones (bench rows)
        self.live: set = set()              # commands running now
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                        "PYTHONPATH", "").split(os.pathsep) if p]),
                    # one fresh compute cache for the check: a process JITs what no earlier one did
                    "CUDA_CACHE_PATH": str(self.work / "cuda-cache")}
        self.env.pop("CUDA_CACHE_DISABLE", None)
        out.mkdir(parents=True, exist_ok=True)
        self.outdir = OutDir(out, self.logs)
        self.report = {"mode": mode.name, "budget_s": budget,
                       "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "machine": machine_info(), "profile": mode.production,
                       "phases": [], "elapsed_s": 0.0}
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
                    self.interrupted(str(e), phases[i + 1:])
                    break
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            try:
                self.write()
            finally:
                self.outdir.clean_work(self.work)
        print(summary_table(self.report))
        return 1 if any(p["status"] == "failed" for p in self.report["phases"]) else 0

    def interrupted(self, why: str, rest: list[Phase]) -> None:
        """The phase in flight (still "running") failed, every later one skipped; a phase that
        had finished keeps its verdict."""
        for proc in list(self.live):
            kill_group(proc)
        self.live.clear()
        if self.report["phases"] and self.report["phases"][-1]["status"] == "running":
            self.report["phases"][-1].update(status="failed", reason=f"interrupted ({why})")
        for p in rest:
            self.report["phases"].append(
                {"name": p.name, "title": p.title, "status": "skipped",
                 "predicted_s": float(self.mode.predicted_s[p.name]), "seconds": 0.0,
                 "reason": f"the check was interrupted ({why})"})

    def _skip_reason(self, phase: Phase, predicted: float, left: float) -> str | None:
        if self.only is not None and phase.name not in self.only:
            return "not asked for (--phases)"
        min_s = self.mode.capped_s.get(phase.name)
        if min_s is not None:           # capped: starts with min_s left, stopped at what is left
            if left < min_s:
                return (f"capped: {max(left, 0):.0f} s of the budget left, it starts with "
                        f"{min_s:.0f} s")
            return None
        if predicted > left:
            return f"predicted {predicted:.0f} s, {max(left, 0):.0f} s of the budget left"
        return None

    def run_phase(self, phase: Phase) -> None:
        predicted = float(self.mode.predicted_s[phase.name])
        entry = {"name": phase.name, "title": phase.title, "status": "running",
                 "predicted_s": predicted, "seconds": 0.0}
        self.report["phases"].append(entry)
        left = self.left()
        skip = self._skip_reason(phase, predicted, left)
        if skip is not None:
            entry.update(status="skipped", reason=skip)
            self.write()
            return
        self.write()                        # a check killed from outside shows what ran
        timeout = min(self.mode.timeout_factor * predicted + self.mode.timeout_extra_s,
                      max(left, 0) + HARD_SLACK_S)
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
        finally:
            ended = ctx.end_all()
            entry["seconds"] = round(time.monotonic() - t, 3)
            entry["checks"] = ctx.checks
            if ended:
                entry["ended_at_phase_end"] = ended
            entry.update(ctx.figures)
        self.write()

    def write(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.t0, 2)
        self.outdir.write_report(self.report)
