"""The inspect plot: loss per step (with the embedded stream's floor) and the step-time histogram."""
from __future__ import annotations

import numpy as np

from staging import paths

from .errors import UserError

SMOOTH_STEPS = 50        # moving-average window drawn over the raw per-step loss
HIST_BINS = 60


class PlotUnavailable(UserError):
    """matplotlib is an optional extra."""


def plot(rf, path, floor: float | None = None) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed",
                              "pip install 'coppelius[plot]'") from None

    losses = rf.step_losses()                                # (steps,)
    dev_ms = rf.device_step_ns() / 1e6                       # (updates,)
    gap_us = rf.host_gaps_ns() / 1e3                         # (issues-1,)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), width_ratios=(1.6, 1))
    fig.suptitle(f"{rf.path} — profile {rf.profile.name}, {rf.outcome}, "
                 f"{rf.steps:,}/{int(rf.status['steps_planned']):,} steps", fontsize=11)
    steps = np.arange(losses.size)
    if losses.size:
        smooth = losses.size >= 2 * SMOOTH_STEPS
        # a faint line under its running mean for long runs; a plain marked line for short ones
        ax1.plot(steps, losses, lw=0.6 if smooth else 1.6, color="tab:blue",
                 alpha=0.35 if smooth else 1.0, marker=None if smooth else "o", ms=3,
                 label="loss per step")
        if smooth:
            k = np.ones(SMOOTH_STEPS) / SMOOTH_STEPS
            ax1.plot(steps[SMOOTH_STEPS - 1:], np.convolve(losses, k, "valid"), lw=1.6,
                     color="tab:blue", label=f"mean of {SMOOTH_STEPS} steps")
    if floor is not None:
        ax1.axhline(floor, color="tab:red", ls="--", lw=1.2,
                    label=f"embedded stream floor {floor:.3f}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("mean cross-entropy (nats)")
    ax1.set_title("loss")
    ax1.grid(alpha=0.3)
    if losses.size or floor is not None:
        ax1.legend(loc="best", fontsize=9)
    if not losses.size:
        ax1.text(0.5, 0.5, "no completed steps", ha="center", va="center",
                 transform=ax1.transAxes)

    if dev_ms.size:
        ax2.hist(dev_ms, bins=HIST_BINS, color="tab:green")
        p50, p99 = np.percentile(dev_ms, [50, 99])
        ax2.axvline(p50, color="k", lw=1, label=f"p50 {p50:.2f} ms")
        ax2.axvline(p99, color="k", lw=1, ls=":", label=f"p99 {p99:.2f} ms")
        ax2.legend(loc="upper right", fontsize=9)
    else:
        ax2.text(0.5, 0.5, "no timed update steps", ha="center", va="center",
                 transform=ax2.transAxes)
    gap_note = (f"host gap fence→issue: p50 {np.percentile(gap_us, 50):.1f} µs, "
                f"p99 {np.percentile(gap_us, 99):.1f} µs" if gap_us.size else "")
    ax2.set_title("device time per update step")
    ax2.set_xlabel("ms" + (f"\n{gap_note}" if gap_note else ""))
    ax2.set_ylabel("steps")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise paths.os_refusal(e, "plot", path, "write", PlotUnavailable) from None
    finally:
        plt.close(fig)
