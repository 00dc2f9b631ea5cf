"""The embedded stream's levels along one run: each step's context floor and no-copy level, and the
window means that the progress line, `inspect` and its plot show.

Step s of a run that starts at update count c0 trains on context c0 + s (host/run/loop.py), so the
levels of a run are `coppelius.staging.synthetic`'s per-context values at contexts c0 .. c0 + steps - 1,
computed once per run (vectorized: ≈ 10 ms for all 20,000 contexts) and read by step after that.
They mean something only for a run on the embedded stream (no `--tokens`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coppelius.staging import synthetic

WINDOW = 100     # steps in the running mean shown against the floor (progress, inspect, plot)


@dataclass(frozen=True)
class Window:
    """Means over the steps first .. first + steps - 1 of a run (nats/token)."""
    first: int                # first step in the window
    steps: int                # steps in it: WINDOW, fewer early in a run
    loss: float               # mean loss (non-finite when one step's is)
    floor: float              # mean floor of those steps' contexts
    no_copy: float            # mean no-copy level of those contexts

    @property
    def over_floor(self) -> float:
        """Mean of loss − floor over the window (= loss − floor: means over the same steps)."""
        return self.loss - self.floor

    def as_dict(self) -> dict:
        finite = np.isfinite(self.loss)
        return {"first_step": self.first, "steps": self.steps,
                "mean_loss": float(self.loss) if finite else None, "mean_floor": self.floor,
                "loss_minus_floor": float(self.over_floor) if finite else None,
                "no_copy": self.no_copy}


@dataclass(frozen=True)
class RunLevels:
    """Per step of one run on the embedded stream: its context's floor and no-copy level."""
    c0: int
    floor: np.ndarray         # (steps,) f64: floor of context c0 + s
    no_copy: np.ndarray       # (steps,) f64: no-copy level of context c0 + s

    @classmethod
    def of_run(cls, profile, c0: int, steps: int) -> "RunLevels | None":
        """The levels of steps 0 .. steps-1 from update count c0; None when those contexts are not
        all in the embedded stream (then no floor is known for them)."""
        if c0 < 0 or steps < 0 or c0 + steps > synthetic.CONTEXTS:
            return None
        contexts = c0 + np.arange(steps, dtype=np.int64)                    # (steps,)
        return cls(c0, synthetic.context_floor(profile, contexts),
                   synthetic.context_no_copy(profile, contexts))

    @property
    def steps(self) -> int:
        return self.floor.size

    def window(self, losses, window: int = WINDOW) -> Window | None:
        """The last `window` of `losses` (this run's per-step mean losses so far, a list or an
        array of done ≤ steps; only its tail is read); None before the first step."""
        done = len(losses)
        if done == 0:
            return None
        if done > self.steps:
            raise ValueError(f"{done} losses for a run of {self.steps} steps")
        first = max(0, done - window)
        recent = np.asarray(losses[first:done], np.float64)                 # (≤ window,)
        return Window(first, done - first, float(recent.mean()),
                      float(self.floor[first:done].mean()), float(self.no_copy[first:done].mean()))


def trailing_mean(values, window: int = WINDOW) -> np.ndarray:
    """(n,) f64: at step i, the mean of values[max(0, i - window + 1) .. i] (fewer steps at the
    start, so the curve begins at step 0); a non-finite value spoils only the windows holding it."""
    v = np.asarray(values, np.float64)                                      # (n,)
    if v.size == 0:
        return v.copy()
    sums = np.convolve(v, np.ones(min(window, v.size)))[:v.size]           # (n,) fixed order
    return sums / np.minimum(np.arange(1, v.size + 1), window)
