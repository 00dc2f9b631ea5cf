"""One `coppelius run` process per target, all at once, each in its own work directory from a
fresh checkpoint; watched until each exits, is killed, or outlives the timeout (then killed: a hung
GPU).  A child that dies or hangs is recorded with its exit status or signal; the others finish."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from coppelius.plan import profiles
from coppelius.staging import synthetic

POLL_S = 0.05                   # how often the watcher looks at its children
STDERR_TAIL = 2000              # characters of a failed child's stderr kept for the report
KILL_GRACE_S = 5.0              # SIGTERM (the run publishes and writes its tail), then SIGKILL
DEFAULT_TIMEOUT_S = 3600.0      # per GPU: longer is a hang
DIGESTS_NAME = "digests.json"   # each GPU's per-launch digests (--digests, --soak)


@dataclass(frozen=True)
class Invocation:
    """What every child runs: `coppelius run` with these options."""
    profile: str = "coppelius"
    backend: str = "cuda"
    steps: int | None = None                    # --steps N: the quick check
    work: Path = Path("coppelius-node")
    timeout_s: float = DEFAULT_TIMEOUT_S
    digests: bool = False                       # --digests: each GPU digests its first update
    soak: int = 1                               # --soak K: ... replayed K times (implies digests)

    @property
    def digesting(self) -> bool:
        return self.digests or self.soak > 1

    def gpu_directory(self, target) -> Path:
        return self.work.resolve() / f"{'gpu' if target.uuid else 'slot'}{target.index}"


@dataclass
class Child:
    target: object                              # coppelius.node.targets.Target
    directory: Path
    result: Path
    argv: list
    process: subprocess.Popen | None = field(default=None, repr=False)
    log: object = field(default=None, repr=False)   # the child's stdout and stderr (run.log)
    started: float = 0.0
    wall_s: float = 0.0
    ended_unix_s: float | None = None           # when it exited, on the wall clock (metrics)
    returncode: int | None = None
    hung: bool = False
    stderr: str = ""

    @property
    def status(self) -> str:
        """How the process ended, in words."""
        if self.hung:
            return f"hung: still running after the timeout, killed ({self._code()})"
        if self.returncode is not None and self.returncode < 0:
            return f"killed by {_signal_name(-self.returncode)}"
        return f"exit {self.returncode}"

    @property
    def digests(self) -> Path:
        return self.directory / DIGESTS_NAME

    def _code(self) -> str:
        rc = self.returncode
        return _signal_name(-rc) if rc is not None and rc < 0 else f"exit {rc}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def child_command() -> tuple[list, Path | None]:
    """How a child runs `coppelius` (and from where): this Python's installed package, or, where
    this process runs a checkout through the path shim (`python3 -m tools.checkout`: nothing
    installed, the lent GPU image), the same shim from the checkout's root."""
    if any(type(f).__name__ == "CheckoutFinder" for f in sys.meta_path):
        import coppelius
        return [sys.executable, "-m", "tools.checkout"], Path(coppelius.__file__).resolve().parents[1]
    return [sys.executable, "-m", "coppelius.cli"], None


def prepare(inv: Invocation, target) -> Child:
    """The child's work directory, its fresh (empty) checkpoint and its argv."""
    profile = profiles.get(inv.profile)
    directory = inv.gpu_directory(target)
    directory.mkdir(parents=True, exist_ok=True)
    ckpt = directory / f"{profile.name}.ckpt"
    ckpt.write_bytes(b"")                       # a fresh start: never continue an old checkpoint
    result = directory / f"{profile.name}-result-c0.bin"
    argv = [*child_command()[0], "run", "--profile", profile.name, "--backend", inv.backend,
            "--directory", str(inv.work.resolve()), "--checkpoint", str(ckpt),
            "--result", str(result),
            "--overwrite", "--quiet"]
    if inv.backend == "cuda":
        argv += ["--device", str(target.index)]
    if inv.steps is not None:
        argv += ["--steps", str(inv.steps)]
    if inv.digesting:
        argv += ["--digests", str(directory / DIGESTS_NAME)]
    if inv.soak > 1:
        argv += ["--soak", str(inv.soak)]
    return Child(target, directory, result, argv)


def run_children(inv: Invocation, targets: list, on_poll=None) -> list[Child]:
    """Start one child per target, then watch them all (see the module docstring); `on_poll()`
    runs at every look (the telemetry's samples)."""
    inv.work.mkdir(parents=True, exist_ok=True)
    # the embedded stream once, here: the children find it and only check it
    synthetic.ensure_default_stream(profiles.get(inv.profile), inv.work)
    children = [prepare(inv, t) for t in targets]
    for c in children:
        c.log = open(c.directory / "run.log", "w+b")
        c.started = time.monotonic()
        c.process = subprocess.Popen(c.argv, stdout=c.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     cwd=child_command()[1])
    old = signal.signal(signal.SIGTERM, _interrupted) if _main_thread() else None
    try:
        _watch(children, inv.timeout_s, on_poll or (lambda: None))
    except BaseException:               # interrupted: every child finishes its step and stops
        for c in children:
            if c.process.poll() is None:
                _stop(c.process)
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return children


class NodeInterrupted(KeyboardInterrupt):
    """SIGTERM to `coppelius node`: its children are stopped as a run is (SIGTERM first)."""


def _interrupted(signum, frame):
    raise NodeInterrupted(f"interrupted by {_signal_name(signum)}")


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _watch(children: list[Child], timeout_s: float, on_poll) -> None:
    running = list(children)
    while running:
        on_poll()
        for c in list(running):
            rc = c.process.poll()
            if rc is None and time.monotonic() - c.started > timeout_s:
                c.hung = True
                rc = _stop(c.process)
            if rc is None:
                continue
            c.returncode, c.wall_s = rc, time.monotonic() - c.started
            c.ended_unix_s = time.time()
            c.stderr = _tail(c.log)
            running.remove(c)
        if running:
            time.sleep(POLL_S)


def _stop(process: subprocess.Popen) -> int:
    """SIGTERM to the child's session, SIGKILL after the grace time; its exit status."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            return process.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def _tail(log) -> str:
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    return text[-STDERR_TAIL:]
