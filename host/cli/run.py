"""`coppelius run`: the main job, with live progress and a closing summary."""
from __future__ import annotations

import datetime
import time
from pathlib import Path

import numpy as np

from coppelius.staging.synthetic import DEFAULT_DIRECTORY

from coppelius.staging.errors import UserError
from coppelius.cli.options import add_device_argument
from coppelius.levels import WINDOW
from coppelius.run.ring import DEFAULT_FENCE_TIMEOUT_S

ORDER = 10


def register(sub) -> None:
    p = sub.add_parser("run", help="train for one invocation (with no arguments: the embedded default)",
                       description="Train the model for the profile's steps: forward, one update "
                       "issue per step, a publication every interval, final, result tail.")
    p.add_argument("--tokens", type=Path, help="token cache (default: the embedded synthetic stream)")
    p.add_argument("--checkpoint", type=Path,
                   help="checkpoint path: zero bytes = fresh start, a checkpoint = continue "
                   f"(default: {DEFAULT_DIRECTORY}/<profile>.ckpt)")
    p.add_argument("--result", type=Path,
                   help="result file to create "
                   f"(default: {DEFAULT_DIRECTORY}/<profile>-result-c<c0>.bin)")
    p.add_argument("--profile", default="coppelius", help="coppelius (default) or tiny")
    p.add_argument("--backend", default="cuda", choices=["cuda", "interpret"],
                   help="cuda (default; the GPU) or interpret (Triton's interpreter on the CPU)")
    add_device_argument(p)
    p.add_argument("--source", type=Path, help="the token cache's source; its mtime and size must "
                   "match the cache header")
    p.add_argument("--overwrite", action="store_true", help="replace an existing result file")
    p.add_argument("--fence-timeout", type=float, default=DEFAULT_FENCE_TIMEOUT_S, metavar="S",
                   help="seconds to wait for a submission's fence "
                   f"(default {DEFAULT_FENCE_TIMEOUT_S:g})")
    p.add_argument("--directory", type=Path, default=Path(DEFAULT_DIRECTORY),
                   help=f"where the embedded default's files live (default ./{DEFAULT_DIRECTORY})")
    p.add_argument("--steps", type=int, help="stop after N steps (tests and benchmarks; default: "
                   "the profile's, 10,000 for coppelius)")
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.add_argument("--digests", type=Path, metavar="FILE",
                   help="also write the per-launch digests of one update step to FILE (JSON): "
                   "each launch run again alone, its reads and writes summarized, for "
                   "`coppelius bisect` (the run's results are unchanged)")
    p.add_argument("--digest-step", type=int, metavar="N",
                   help="the step whose update --digests describes (0-based, within this run; "
                   "default 0)")
    p.add_argument("--soak", type=int, default=1, metavar="K",
                   help="with --digests: replay that step K times from its one saved state and "
                   "compare every repetition's digests with the first (`coppelius soak FILE` "
                   "names a transient fault by launch and region)")
    p.set_defaults(func=run, handles_signals=True)    # coppelius.run.loop._Signals from the start


def loss_text(losses, levels, window: int = WINDOW) -> str:
    """The progress line's loss field: the mean loss of the last `window` steps and, on the
    embedded stream (`levels`: coppelius.levels.RunLevels), that window's mean floor, the mean of
    loss − floor and the window's no-copy level (a window resting there: copying not learned)."""
    if levels is None:
        recent = np.asarray(losses[-window:], np.float64)    # (≤ window,): only the tail is read
        return f"loss {recent.mean():.4f} (mean of {recent.size})" if recent.size else "loss —"
    w = levels.window(losses, window)
    if w is None:
        return "loss —"
    return (f"loss {w.loss:.4f} · floor {w.floor:.4f} (window {w.steps}) · "
            f"{w.over_floor:+.4f} over floor · no-copy {w.no_copy:.4f}")


def _floor_caption(levels) -> str:
    """The start line's note on the floor: this run's mean over its contexts, the no-copy level."""
    if levels is None or not levels.steps:
        return ""
    return (f"; embedded stream: floor {levels.floor.mean():.4f} nats/token over this run's "
            f"contexts ({levels.floor.min():.2f}–{levels.floor.max():.2f} per context), no-copy "
            f"{levels.no_copy.mean():.4f}; shown: the last {WINDOW} steps' mean against their "
            "floor")


def plural(n: int, word: str) -> str:
    """'1 step', '2 steps', '0 publications'."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def left_field(task) -> str:
    """The bar's remaining time: 'left 0:01:32' while it runs, 'done' once every step is."""
    if task.finished:
        return "done"
    left = task.time_remaining
    return "left -:--:--" if left is None else f"left {datetime.timedelta(seconds=int(left))}"


def _field_column(text_of):
    """A rich column showing `text_of(task)`, computed when the bar refreshes (rich's own thread,
    4 times a second), not when a step completes."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class FieldColumn(ProgressColumn):
        def render(self, task):
            return Text(text_of(task))

    return FieldColumn()


def _bar_with_line(line_of, *columns, **kw):
    """A rich Progress whose bar has the line `line_of()` under it, computed when the bar
    refreshes (rich's thread), never on the step path; on its own line it fits 80 columns
    (the bar's row is full with the step, rate, times and publications)."""
    from rich.progress import Progress
    from rich.text import Text

    class BarWithLine(Progress):
        def get_renderables(self):             # rich's documented hook for a custom layout
            yield self.make_tasks_table(self.tasks)
            yield Text(line_of(), no_wrap=True, overflow="ellipsis")

    return BarWithLine(*columns, **kw)


class RichProgress:
    """Step, window loss vs floor, tokens/s, elapsed, remaining, publications — refreshed off the
    step path."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console
        self.console = Console(stderr=True, emoji=False)    # a path's ":x:" is no emoji code
        self.quiet = quiet
        self.bar = None

    def start(self, summary, levels, tokens_per_step):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        self.summary, self.levels, self.tokens_per_step = summary, levels, tokens_per_step
        self.t0 = time.monotonic()
        from rich.markup import escape        # a path may hold "[...]": never read as markup
        self.console.print(f"[bold]coppelius run[/bold]: c0={summary.c0}, "
                           f"{plural(summary.steps_planned, 'step')}, "
                           f"checkpoint {escape(str(summary.checkpoint))}, "
                           f"result {escape(str(summary.result))}"
                           + escape(_floor_caption(levels)), soft_wrap=True, highlight=False)
        if self.quiet:
            return
        rate = _field_column(lambda task: self.rate_field(task.completed))
        self.bar = _bar_with_line(self.loss_field, TextColumn("step"), MofNCompleteColumn(),
                                  BarColumn(), rate, TimeElapsedColumn(), _field_column(left_field),
                                  TextColumn("{task.fields[pubs]}"), console=self.console,
                                  refresh_per_second=4, transient=False)
        self.bar.start()
        self.task = self.bar.add_task("train", total=summary.steps_planned, pubs="0 published")

    def loss_field(self) -> str:
        return loss_text(self.summary.losses, self.levels)

    def rate_field(self, completed) -> str:
        elapsed = time.monotonic() - self.t0
        if not completed:
            return ""
        return f"{completed * self.tokens_per_step / max(elapsed, 1e-9):,.0f} tok/s"

    def step(self, step, loss):
        # the run loop has appended `loss` to summary.losses: the line reads it when it renders
        if self.bar is not None:
            self.bar.update(self.task, completed=step + 1)

    def published(self, update_count, seconds):
        if self.bar is not None:
            self.bar.update(self.task, pubs=f"{self.summary.publications} published")
        else:
            self.console.print(f"published update {update_count} ({seconds:.2f} s)")

    def note(self, text):
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)

    def stop(self):
        if self.bar is not None:
            self.bar.stop()


def run(args) -> int:
    from coppelius.plan import profiles
    from coppelius.staging import records as R

    from coppelius.run.loop import Request, run as run_loop

    profile = profiles.get(args.profile)
    req = Request(profile=profile, tokens=args.tokens, checkpoint=args.checkpoint,
                  result=args.result, backend=args.backend, device=args.device, source=args.source,
                  overwrite=args.overwrite, fence_timeout_s=args.fence_timeout,
                  directory=args.directory, steps=args.steps, digests=args.digests,
                  digest_step=0 if args.digest_step is None else args.digest_step,
                  digest_perturb=getattr(args, "digest_perturb", None),   # tools/perturb_digests
                  soak=args.soak)
    if args.digest_step is not None and args.digests is None:
        raise UserError("--digest-step needs --digests FILE", "name the file the digests go to")
    progress = RichProgress(quiet=args.quiet)
    summary = run_loop(req, progress)
    losses = summary.losses
    outcome = R.OUTCOMES[summary.outcome]
    line = (f"{outcome}: {summary.steps_completed}/{plural(summary.steps_planned, 'step')}, "
            f"update count {summary.update_count}, {plural(summary.publications, 'publication')}, "
            f"{summary.wall_s:.1f} s")
    if losses:
        line += f", loss {losses[0]:.4f} → {losses[-1]:.4f}"
    # one line at any width (rich wraps at 80 columns when stderr is not a terminal), and paths
    # or messages are never read as markup
    progress.console.print(line, soft_wrap=True, markup=False, highlight=False)
    progress.console.print(f"result {summary.result}; checkpoint {summary.checkpoint}",
                           soft_wrap=True, markup=False, highlight=False)
    if summary.error:
        progress.console.print(summary.error, style="red", soft_wrap=True, markup=False,
                               highlight=False)
    return summary.exit_code
