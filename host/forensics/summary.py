"""What `coppelius inspect` shows of a result file, as JSON-ready data: `summarize`.

The identity, the size against the formula, the losses and their summary, the embedded stream's
floor (when the run is known to be on it: `stream_used`), the timing, the device's records decoded,
the final predictions as text, the warnings.  The command line renders it (host/cli/inspect.py).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from coppelius.plan.profiles import PREDICTION_ROWS
from coppelius.staging.records import INFO_NAMES

from coppelius.levels import WINDOW, RunLevels
from coppelius.results import telemetry_file
from coppelius.tokenizer import DEFAULT_TOKENIZER as TOKENIZER

LAST_N = WINDOW                  # the loss summary's "mean of the last N steps": the floor's window
STREAM_CHOICES = ("auto", "embedded", "none")


def stream_used(rf, choice: str = "auto") -> dict:
    """Whether the run trained on the embedded stream, and on what inspect believes it.

    The result file records no stream identity, and only `verify` (which recomputes the forward
    logits from the tokens) can prove one.  `auto` takes the layout `coppelius run` leaves when it
    trains on the embedded stream: the result under its default name `<profile>-result-c<c0>.bin`
    in the directory holding `<profile>-stream.tokens` of the stream's exact size.  A named
    --result (the fleet recipe) or a copied file needs `--stream embedded`."""
    from coppelius.staging import synthetic
    if choice != "auto":
        return {"embedded": choice == "embedded", "basis": f"--stream {choice}", "path": None}
    here = Path(rf.path)
    name = rf.profile.name
    default_name = f"{name}-result-c{int(rf.status['c0'])}.bin"
    stream = here.parent / f"{name}{synthetic.STREAM_SUFFIX}"
    found = (here.name == default_name and stream.is_file()
             and stream.stat().st_size == synthetic.stream_bytes(rf.profile))
    if found:
        return {"embedded": True, "basis": f"auto: default-named result beside {stream}",
                "path": str(stream)}
    return {"embedded": False, "basis": f"auto: no {default_name} beside {stream.name} "
            "(--stream embedded if the run used it)", "path": None}


def run_levels(rf, stream: dict):
    """The embedded stream's floor and no-copy level of each step's context (coppelius.levels), or None
    for a run not known to be on it.  The result file records c0 (status block): step s trained on
    context c0 + s."""
    if not stream["embedded"]:
        return None
    return RunLevels.of_run(rf.profile, int(rf.status["c0"]), rf.steps)


def floor_summary(rf, levels) -> dict | None:
    """The last window's means (coppelius.levels.Window) with the copy-block loss (the mean loss of the
    window's copy-content rows: under 0.5 once copying is learned, docs/STREAM.md) and the stream's
    expected floor and no-copy level; None when no floor is known."""
    from coppelius.staging import synthetic
    if levels is None:
        return None
    w = levels.window(rf.step_losses())
    out = {"window": WINDOW, "stream_floor": synthetic.loss_floor(rf.profile),
           "stream_no_copy": synthetic.no_copy_level(rf.profile)}
    if w is None:
        return {**out, "first_step": None, "steps": 0, "mean_loss": None, "mean_floor": None,
                "loss_minus_floor": None, "no_copy": None, "copy_block_loss": None}
    copy = synthetic.copy_rows(rf.profile, levels.c0 + np.arange(w.first, w.first + w.steps))
    rows = rf.losses[w.first:w.first + w.steps]                            # (steps, T) f32
    copy_loss = rows[copy].mean(dtype=np.float64) if copy.any() else None  # (steps, T) mask
    return {**out, **w.as_dict(),
            "copy_block_loss": None if copy_loss is None else _finite(copy_loss)}


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _pct(values: np.ndarray, q: float):
    return float(np.percentile(values, q)) if values.size else None


def percentiles(values: np.ndarray) -> tuple[float | None, float | None]:
    """(p50, p99) of a per-update time series, (None, None) when empty: what inspect's timing
    table and the plot's panel titles both show."""
    return _pct(values, 50), _pct(values, 99)


def host_gaps_us(rf) -> tuple[np.ndarray, np.ndarray]:
    """((k,) step, (k,) µs): the host gap before each update issue (the previous issue's fence →
    this issue; the forward's fence for step 0), the one series inspect and the plot summarize."""
    steps, gap_ns = rf.update_gaps()
    return steps, gap_ns / 1e3


def summarize(rf, stream: dict | None = None) -> dict:
    """Everything inspect shows, as JSON-ready values; `stream` from `stream_used`."""
    from coppelius.staging import layout as L
    from coppelius.staging import records as R
    from coppelius.staging.result_sections import SECTIONS
    from coppelius.results.reader import record_dict

    losses = rf.step_losses()                                    # (steps,) f64
    finite = np.isfinite(losses)
    status = record_dict(rf.status)
    status["outcome_name"] = rf.outcome
    status["backend_name"] = R.BACKENDS.get(status["backend"], "unknown")
    preds = np.asarray(rf.status["predictions"])                 # (3, {token, valid})
    texts = decode_tokens(rf.profile, [int(t) for t in preds[:, 0]])
    status["predictions"] = [{"row": row, "token": int(t), "valid": int(v), "text": txt}
                             for row, (t, v), txt in zip(PREDICTION_ROWS, preds, texts)]
    notifier = record_dict(rf.error_notifier)
    notifier["info_name"] = info_name(notifier["info32"]) if notifier["status"] else None
    sems = []
    for i, slot in enumerate(rf.semaphores):
        d = record_dict(slot)
        d["submission"] = L.SUBMISSIONS[i]
        sems.append(d)
    stream = stream_used(rf) if stream is None else stream
    dev = rf.device_step_ns()
    _, gap_us = host_gaps_us(rf)
    gap_p50, gap_p99 = percentiles(gap_us)
    ts = rf.timestamps
    loss_summary = {"first": None, "last": None, "min": None, "min_step": None,
                    f"mean_last_{LAST_N}": None, "non_finite_steps": int((~finite).sum())}
    # the GPU's telemetry beside the file (FORMATS §12): shown, or a warning saying why not
    ran_on = rf.gpu_identity()
    telemetry = telemetry_file.for_result(rf.path, ran_on, status["c0"])
    warnings = rf.warnings()
    if telemetry is not None and telemetry["error"]:
        warnings.append(telemetry["error"])                     # never a refusal: advisory
    if losses.size:
        loss_summary.update(first=_finite(losses[0]), last=_finite(losses[-1]),
                            **{f"mean_last_{LAST_N}": _finite(losses[-LAST_N:].mean())})
        if finite.any():
            k = int(np.nanargmin(np.where(finite, losses, np.nan)))
            loss_summary.update(min=float(losses[k]), min_step=k)
    return {
        "path": rf.path, "profile": rf.profile.name, "size": rf.size,
        "expected_size": rf.expected_size,
        "sections": [{"section": s.name, "label": s.label, "offset": rf.offsets[s.name][0],
                      "size": rf.offsets[s.name][1],
                      "type": "f32" if s.record is None else s.record.name} for s in SECTIONS],
        "outcome": rf.outcome,
        "outcome_code": rf.outcome_code, "steps_completed": rf.steps,
        "steps_planned": status["steps_planned"], "issues": rf.issues,
        "losses": [_finite(x) for x in losses],
        "loss_summary": loss_summary,
        "stream": stream,
        "floor": floor_summary(rf, run_levels(rf, stream)),
        "publication_steps": rf.publication_steps().tolist(),
        "timing": {
            "updates_timed": int(dev.size),
            "device_step_ms_p50": _ms(_pct(dev, 50)), "device_step_ms_p99": _ms(_pct(dev, 99)),
            "device_step_ms_max": _ms(float(dev.max()) if dev.size else None),
            "host_gaps_timed": int(gap_us.size), "host_gap_us_p50": gap_p50,
            "host_gap_us_p99": gap_p99, "host_gap_us_max": float(gap_us.max()) if gap_us.size
            else None},
        "status": status, "ran_on": ran_on, "telemetry": telemetry,
        "checkpoint_digest": rf.checkpoint_digest(),
        "error_notifier": notifier, "semaphores": sems,
        "stat": record_dict(rf.stat),
        "timestamps": {name: ts[name].tolist() for name in ts.dtype.names},   # columns
        "forward_argmax": [int(i) for i in np.argmax(rf.forward, axis=1)],
        "final_argmax": int(np.argmax(rf.final)) if rf.final.size else None,
        "warnings": warnings,
    }


def _ms(ns):
    return None if ns is None else ns / 1e6


def _us(ns):
    return None if ns is None else ns / 1e3


def info_name(code: int) -> str:
    """Name a notifier info32: a Coppelius host code, else the CUresult's name when cuda-python
    is importable, else the number."""
    if code in INFO_NAMES:
        return INFO_NAMES[code]
    from coppelius.driver.calls import error_name
    return error_name(code)


def decode_tokens(profile, ids: list[int]) -> list[str | None]:
    """Text of token ids with the shipped tokenizer (coppelius profile only); None when it or the
    `tokenizers` package is missing, quietly: a GPU machine may lack it."""
    if profile.name != "coppelius" or not TOKENIZER.exists():
        return [None] * len(ids)
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(TOKENIZER))
        return [tok.decode([i]) for i in ids]
    except Exception:
        return [None] * len(ids)
