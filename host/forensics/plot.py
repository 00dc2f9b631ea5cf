"""The inspect plot: loss, device time and host gap per step on shared step axes, with the
checkpoint publications and the run's end marked.

Everything drawn comes from the result file: the step windows (loss), the timestamp table (device
time per update = final release − pre-launch release; host gap = previous fence → this issue), the
status block (outcome, publications) and the error notifier (why it stopped).  On the embedded
stream (the caller says so by passing its `coppelius.levels.RunLevels`) the loss panel also draws each
step's context floor (thin), its running mean over the same window as the loss's, and the running
no-copy level: a loss resting on that line has learned the chain but not the copy blocks.
"""
from __future__ import annotations

import os

import numpy as np

from coppelius.staging import paths
from coppelius.staging import records as R

from coppelius.extras import install_command
from coppelius.staging.errors import UserError
from coppelius.levels import WINDOW, trailing_mean
from coppelius.forensics.summary import host_gaps_us, percentiles

SMOOTH_STEPS = WINDOW    # running-mean window of loss, floor and no-copy (as progress and inspect)
FIGSIZE = (12.0, 9.0)    # inches; at DPI this is the PNG's size in pixels
DPI = 110
MAX_LABELLED_PUBLICATIONS = 12   # more than this: lines only, no update-count labels
MARKED_STEPS = 200        # up to this many steps a series carries a marker per step
GAP_LOG_RATIO = 20.0     # host gap axis goes logarithmic when max/median exceeds this
PUBLICATION_COLOUR = "tab:purple"
STOP_COLOUR = "tab:red"
FLOOR_COLOUR = "darkslategray"   # not a neutral grey: antialiased black text makes those
NO_COPY_COLOUR = "tab:brown"


class PlotUnavailable(UserError):
    """matplotlib is an optional extra."""


def _matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed",
                              install_command("plot")) from None
    return Figure, MaxNLocator


# The PNG's Software text chunk names its writer, so that `inspect --plot` replaces only a plot
# it wrote (never a user's image or another file at that path)
SOFTWARE = "coppelius inspect --plot"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_TEXT = b"tEXt"
PNG_SOFTWARE_KEY = b"Software"
PNG_CHUNK_HEAD = 8              # u32 BE length, 4-byte type; then the data and a 4-byte CRC
PNG_CRC_BYTES = 4
PNG_READ_LIMIT = 1 << 16        # the text chunks come before the image data


def recognize(path) -> str | None:
    """None when the file at `path` is a plot this command wrote (a PNG whose Software text says
    SOFTWARE) or is empty; else what it is instead."""
    head = paths.head_bytes(path, PNG_READ_LIMIT)
    if not head and not os.path.getsize(path):
        return None
    if not head.startswith(PNG_SIGNATURE):
        return "it is not a PNG image"
    at = len(PNG_SIGNATURE)
    while at + PNG_CHUNK_HEAD <= len(head):
        length = int.from_bytes(head[at:at + 4], "big")
        kind = head[at + 4:at + PNG_CHUNK_HEAD]
        data = head[at + PNG_CHUNK_HEAD:at + PNG_CHUNK_HEAD + length]
        if kind == PNG_TEXT and data == PNG_SOFTWARE_KEY + b"\0" + SOFTWARE.encode("latin-1"):
            return None
        at += PNG_CHUNK_HEAD + length + PNG_CRC_BYTES
    return "it is a PNG image that `coppelius inspect --plot` did not write"


def plot(rf, path, levels=None) -> None:
    """Write `figure(rf, levels)` to `path` as a PNG of FIGSIZE × DPI pixels, signed SOFTWARE."""
    fig = figure(rf, levels)
    try:
        fig.savefig(path, dpi=DPI, format="png", metadata={"Software": SOFTWARE})
    except OSError as e:
        raise paths.os_refusal(e, "plot", path, "write", PlotUnavailable) from None


def figure(rf, levels=None):
    """The three panels (loss, device time per update, host gap) sharing one step axis.
    `levels`: the embedded stream's per-step floor and no-copy level (coppelius.levels.RunLevels of at
    least the file's steps), or None for a run not known to be on it."""
    Figure, MaxNLocator = _matplotlib()
    fig = Figure(figsize=FIGSIZE)
    ax_loss, ax_dev, ax_gap = fig.subplots(3, 1, sharex=True, height_ratios=(2.2, 1, 1))
    st = rf.status
    c0, planned = int(st["c0"]), int(st["steps_planned"])
    fig.suptitle(f"{rf.path}\nprofile {rf.profile.name}, backend "
                 f"{R.BACKENDS.get(int(st['backend']), '?')}, {rf.outcome}: "
                 f"{rf.steps:,}/{planned:,} steps from update {c0:,}", fontsize=11)
    _loss_panel(ax_loss, rf, levels)
    _device_panel(ax_dev, rf)
    _gap_panel(ax_gap, rf)
    for ax in (ax_loss, ax_dev, ax_gap):
        ax.grid(alpha=0.3)
        ax.set_xlim(-0.5, max(planned, rf.steps))      # room for the mark after the last step
    ax_gap.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    _mark_publications((ax_loss, ax_dev, ax_gap), rf)
    _mark_stop((ax_loss, ax_dev, ax_gap), rf)
    ax_loss.legend(loc="best", fontsize=8)
    ax_gap.set_xlabel(f"step of this invocation (update count = {c0:,} + step + 1)")
    fig.tight_layout()
    return fig


def _empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _loss_panel(ax, rf, levels):
    losses = rf.step_losses()                                # (steps,)
    steps = np.arange(losses.size)
    ax.set_title("loss (mean cross-entropy over the step's 1024 rows)", fontsize=10, loc="left")
    ax.set_ylabel("nats/token")
    if not losses.size:
        _empty(ax, "no completed steps")
        return
    smooth = losses.size >= 2 * SMOOTH_STEPS
    # a faint line under its running mean for long runs; a plain marked line for short ones
    ax.plot(steps, losses, lw=0.6 if smooth else 1.6, color="tab:blue",
            alpha=0.35 if smooth else 1.0, marker=None if smooth else "o", ms=3,
            label="loss per step")
    if smooth:
        ax.plot(steps, trailing_mean(losses, SMOOTH_STEPS), lw=1.6, color="tab:blue",
                label=f"loss, mean of the last ≤ {SMOOTH_STEPS} steps")
    if levels is not None:
        _floor_lines(ax, levels, losses.size)
        w = levels.window(losses, SMOOTH_STEPS)
        ax.set_title(f"loss (mean cross-entropy over the step's 1024 rows); the last {w.steps} "
                     f"steps: {w.loss:.4f}, {w.over_floor:+.4f} over their floor {w.floor:.4f}, "
                     f"no-copy level {w.no_copy:.4f}", fontsize=10, loc="left")
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:       # non-finite steps break the line: mark them on the top edge
        ax.plot(bad, np.ones(bad.size), "x", color=STOP_COLOUR, ms=7,
                transform=ax.get_xaxis_transform(), label=f"non-finite loss ({bad.size})")


def _floor_lines(ax, levels, done):
    """Each step's context floor (thin), its running mean and the running no-copy level, over
    the `done` steps the file holds; the legend gives the last window's values."""
    steps = np.arange(done)
    floor, no_copy = levels.floor[:done], levels.no_copy[:done]           # (done,) each
    floor_mean = trailing_mean(floor, SMOOTH_STEPS)
    no_copy_mean = trailing_mean(no_copy, SMOOTH_STEPS)
    ax.plot(steps, floor, color=FLOOR_COLOUR, lw=0.6, alpha=0.55,
            label="floor of each step's context")
    ax.plot(steps, floor_mean, color=FLOOR_COLOUR, ls="--", lw=1.3,
            label=f"floor, mean of the last ≤ {SMOOTH_STEPS} steps: {floor_mean[-1]:.4f}")
    ax.plot(steps, no_copy_mean, color=NO_COPY_COLOUR, lw=1.3,
            label=f"no-copy level (chain learned, copying not), same mean: {no_copy_mean[-1]:.4f}")


def _series(ax, steps, values, colour) -> None:
    """One per-step series: markers while they stay readable (≤ MARKED_STEPS), a thin line past."""
    dense = steps.size > MARKED_STEPS
    ax.plot(steps, values, color=colour, lw=0.8 if dense else 1.4, marker=None if dense else "o",
            ms=3)


def _timed_panel(ax, steps, values, unit: str, colour: str, name: str, empty: str, title: str,
                 spec: str) -> float | None:
    """A per-update time series with its p50 and p99 in the title (`title` before them, values in
    `spec`), or `name` and `empty` when there is none; returns the p50 (None when empty)."""
    ax.set_ylabel(unit)
    if not values.size:
        ax.set_title(name, fontsize=10, loc="left")
        _empty(ax, empty)
        return None
    p50, p99 = percentiles(values)
    ax.set_title(f"{title}: p50 {p50:{spec}} {unit}, p99 {p99:{spec}} {unit}", fontsize=10,
                 loc="left")
    _series(ax, steps, values, colour)
    return p50


def _device_panel(ax, rf):
    steps, dev_ms = rf.update_steps(), rf.device_step_ns() / 1e6          # (updates,) each
    if _timed_panel(ax, steps, dev_ms, "ms", "tab:green", "device time per update",
                    "no timed update steps",
                    "device time per update (final − pre-launch release)", ".3f") is None:
        return
    failed = rf.timestamps[(rf.timestamps["flags"] & R.FLAG_ERROR) != 0]
    failed = failed[failed["step"] != R.TIMESTAMP_NO_STEP]
    if failed.size:     # an update whose fence never came: no device time, a mark at its step
        ax.plot(failed["step"].astype(np.int64), np.full(failed.size, 0.95), "v",
                color=STOP_COLOUR, ms=8, transform=ax.get_xaxis_transform())


def _gap_panel(ax, rf):
    steps, gap_us = host_gaps_us(rf)                                      # (k,) each
    p50 = _timed_panel(ax, steps, gap_us, "µs", "tab:orange", "host gap before each update",
                       "no update issues", "host gap, previous fence → this update's issue",
                       ",.1f")
    if p50 is not None and p50 > 0 and gap_us.max() / p50 > GAP_LOG_RATIO:
        ax.set_yscale("log")


def _mark_publications(axes, rf):
    """A dotted line between step s and s + 1 for each publication started after step s (its
    snapshot delays step s + 1's issue: look for it in the host gap)."""
    started = rf.publication_steps()
    completed = int(rf.status["publications"])
    c0 = int(rf.status["c0"])
    labelled = set()
    for i, s in enumerate(started):
        ok = i < completed
        label = "checkpoint published (update count)" if ok else "publication not completed"
        for ax in axes:
            ax.axvline(s + 0.5, color=PUBLICATION_COLOUR, ls=":" if ok else "-.", lw=1.2,
                       label=None if label in labelled else label)
            labelled.add(label)
        if started.size <= MAX_LABELLED_PUBLICATIONS:
            # at the foot of the loss panel (the legend is above); left of the line at the end
            lo, hi = axes[0].get_xlim()
            left = s + 0.5 > lo + 0.95 * (hi - lo)
            axes[0].annotate(f"{c0 + s + 1:,}" + ("" if ok else " ✗"), (s + 0.5, 0.0),
                             xycoords=axes[0].get_xaxis_transform(), xytext=(-2 if left else 2, 3),
                             textcoords="offset points", ha="right" if left else "left",
                             fontsize=7, color=PUBLICATION_COLOUR)


def _mark_stop(axes, rf):
    """Where a run that did not complete stopped: a red line at the first step it did not
    complete, with the outcome and the notifier's reason."""
    if rf.outcome_code == R.OUTCOME_COMPLETED:
        return
    n = rf.error_notifier
    at = rf.steps
    if int(n["step"]) != R.NOTIFIER_NO_STEP and rf.outcome_code != R.OUTCOME_INTERRUPTED:
        at = int(n["step"])
    reason = bytes(n["reason"]).rstrip(b"\0").decode("ascii", "replace")
    where = (f"after step {rf.steps - 1:,}" if rf.outcome_code == R.OUTCOME_INTERRUPTED
             and rf.steps else f"at step {at:,}")
    x = at - 0.5 if rf.outcome_code == R.OUTCOME_INTERRUPTED else at
    for k, ax in enumerate(axes):
        ax.axvline(x, color=STOP_COLOUR, lw=2, label=None if k else f"{rf.outcome} {where}")
    right_half = x > sum(axes[0].get_xlim()) / 2
    axes[0].annotate(f"{rf.outcome} {where}" + (f": {reason}" if reason else ""), (x, 0.5),
                     xycoords=axes[0].get_xaxis_transform(), xytext=(-6 if right_half else 6, 0),
                     textcoords="offset points", ha="right" if right_half else "left",
                     va="center", color=STOP_COLOUR, fontsize=9,
                     bbox=dict(facecolor="white", edgecolor=STOP_COLOUR, alpha=0.85))
