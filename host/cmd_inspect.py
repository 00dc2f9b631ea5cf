"""`coppelius inspect RESULT [--json] [--plot PNG]`: result-file forensics, every section decoded."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from plan.profiles import PREDICTION_ROWS
from staging.records import INFO_NAMES

from .levels import WINDOW, RunLevels
from .tokenizer import DEFAULT_TOKENIZER as TOKENIZER

ORDER = 20
LAST_N = WINDOW                  # the loss summary's "mean of the last N steps": the floor's window
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def register(sub) -> None:
    p = sub.add_parser("inspect", help="decode a result file: losses, timing, semaphores, status",
                       description="Decode every section of a result file, check its size against "
                       "the formula, and summarize losses and step times.")
    p.add_argument("result", metavar="RESULT", help="result file of any profile and outcome")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead (non-finite losses are null)")
    p.add_argument("--plot", metavar="PNG", help="also write loss, device time and host gap per "
                   "step, publications and the run's end marked, to PNG (needs matplotlib)")
    p.add_argument("--stream", choices=STREAM_CHOICES, default="auto",
                   help="did the run train on the embedded stream (its floor is shown)? auto "
                   "(default): yes when the result has its default name beside the profile's "
                   "embedded stream file, as `coppelius run` without --tokens leaves them")
    p.set_defaults(func=run)


def run(args) -> int:
    from staging import paths

    from . import result_reader as RF
    if args.plot:                # refuse a plot path that cannot be written before the work
        paths.check_output(args.plot, "plot", overwrite=True, exists_hint=None)
    rf = RF.read(args.result)
    stream = stream_used(rf, args.stream)
    if args.plot:
        from .plot import plot
        plot(rf, args.plot, levels=run_levels(rf, stream))
    info = summarize(rf, stream)
    if args.json:
        json.dump(info, sys.stdout, allow_nan=False, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        render(info, rf)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


# ------------------------------------------------------------------------------------ summary
STREAM_CHOICES = ("auto", "embedded", "none")


def stream_used(rf, choice: str = "auto") -> dict:
    """Whether the run trained on the embedded stream, and on what inspect believes it.

    The result file records no stream identity, and only `verify` (which recomputes the forward
    logits from the tokens) can prove one.  `auto` takes the layout `coppelius run` leaves when it
    trains on the embedded stream: the result under its default name `<profile>-result-c<c0>.bin`
    in the directory holding `<profile>-stream.tokens` of the stream's exact size.  A named
    --result (the fleet recipe) or a copied file needs `--stream embedded`."""
    from staging import synthetic
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
    """The embedded stream's floor and no-copy level of each step's context (host.levels), or None
    for a run not known to be on it.  The result file records c0 (status block): step s trained on
    context c0 + s."""
    if not stream["embedded"]:
        return None
    return RunLevels.of_run(rf.profile, int(rf.status["c0"]), rf.steps)


def floor_summary(rf, levels) -> dict | None:
    """The last window's means (host.levels.Window) with the copy-block loss (the mean loss of the
    window's copy-content rows: under 0.5 once copying is learned, docs/STREAM.md) and the stream's
    expected floor and no-copy level; None when no floor is known."""
    from staging import synthetic
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


def summarize(rf, stream: dict | None = None) -> dict:
    """Everything inspect shows, as JSON-ready values; `stream` from `stream_used`."""
    from staging import layout as L
    from staging import records as R
    from staging.result_sections import SECTIONS
    from .result_reader import record_dict

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
    gap = rf.host_gaps_ns()
    ts = rf.timestamps
    loss_summary = {"first": None, "last": None, "min": None, "min_step": None,
                    f"mean_last_{LAST_N}": None, "non_finite_steps": int((~finite).sum())}
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
            "host_gap_us_p50": _us(_pct(gap, 50)), "host_gap_us_p99": _us(_pct(gap, 99)),
            "host_gap_us_max": _us(float(gap.max()) if gap.size else None)},
        "status": status, "error_notifier": notifier, "semaphores": sems,
        "stat": record_dict(rf.stat),
        "timestamps": {name: ts[name].tolist() for name in ts.dtype.names},   # columns
        "forward_argmax": [int(i) for i in np.argmax(rf.forward, axis=1)],
        "final_argmax": int(np.argmax(rf.final)) if rf.final.size else None,
        "warnings": rf.warnings(),
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
    from .driver import error_name
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


# ------------------------------------------------------------------------------------- render
def sparkline(values: np.ndarray, width: int = SPARK_WIDTH) -> str:
    """The loss curve as one line of block characters (bucket means, min..max scaled)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return ""
    buckets = np.array_split(v, min(width, v.size))
    means = np.array([b.mean() for b in buckets])
    lo, hi = means.min(), means.max()
    idx = np.zeros(means.size, int) if hi == lo else \
        np.round((means - lo) / (hi - lo) * (len(SPARK) - 1)).astype(int)
    return "".join(SPARK[i] for i in idx)


def _f(x, spec=".4f"):
    return "—" if x is None else format(x, spec)


def render(info: dict, rf) -> None:
    """The report `coppelius inspect` prints: what the file is, the losses, the timing, the
    device's records, the predictions, the warnings."""
    from .console import report_console
    c = report_console()
    _render_identity(c, info)
    _render_losses(c, info, rf)
    _render_timing(c, info)
    _render_records(c, info)


def _render_identity(c, info: dict) -> None:
    """The path, profile and outcome; the size against the formula; the status block's run."""
    from .console import styled
    st = info["status"]
    ok = info["size"] == info["expected_size"]
    colour = "green" if info["outcome_code"] == 0 else "red"
    c.print(styled((str(info["path"]), "bold"), "  profile ", (info["profile"], "bold"),
                   "  outcome ", (info["outcome"], colour)))
    c.print(f"size {info['size']:,} bytes, formula {info['expected_size']:,} "
            f"({'matches' if ok else 'MISMATCH'}): {info['steps_completed']:,} step windows, "
            f"{info['issues']:,} timestamp entries")
    c.print("sections: " + " · ".join(f"{s['label']} {s['size']:,}" for s in info["sections"]))
    cc = st["compute_capability"]
    drv = st["driver_version"]
    c.print(f"backend {st['backend_name']}, device {st['device_name'] or '—'}, compute capability "
            f"{cc // 10}.{cc % 10}, driver {drv // 1000}.{drv % 1000 // 10}; c0 {st['c0']:,}, "
            f"steps {st['steps_completed']:,}/{st['steps_planned']:,}, update count "
            f"{st['update_count']:,}, publications {st['publications']}, wall "
            f"{st['wall_ns'] / 1e9:,.1f} s")


def _render_losses(c, info: dict, rf) -> None:
    """The loss table, the floor of the embedded stream, the curve, the publications."""
    from rich.table import Table
    st = info["status"]
    ls = info["loss_summary"]
    t = Table(title="loss (mean cross-entropy per step)", title_justify="left")
    for col in ("first", "last", "min (step)", f"mean last {LAST_N}", "non-finite"):
        t.add_column(col, justify="right")
    t.add_row(_f(ls["first"]), _f(ls["last"]),
              "—" if ls["min"] is None else f"{ls['min']:.4f} ({ls['min_step']:,})",
              _f(ls[f"mean_last_{LAST_N}"]), str(ls["non_finite_steps"]))
    c.print(t)
    fl = info["floor"]
    if fl is not None and fl["steps"]:
        t = Table(title=f"against the embedded stream's floor, steps {fl['first_step']:,}–"
                  f"{fl['first_step'] + fl['steps'] - 1:,} (the last {fl['steps']:,}; per context)",
                  title_justify="left")
        for col in ("mean loss", "mean floor", "loss − floor", "no-copy level", "copy-block loss"):
            t.add_column(col, justify="right")
        t.add_row(_f(fl["mean_loss"]), _f(fl["mean_floor"]), _f(fl["loss_minus_floor"], "+.4f"),
                  _f(fl["no_copy"]), _f(fl["copy_block_loss"]))
        c.print(t)
    if info["losses"]:
        c.print(f"curve  {sparkline(rf.step_losses())}")
    s = info["stream"]
    c.print(f"stream: {'the embedded stream' if s['embedded'] else 'not known to be the embedded stream'}"
            f" ({s['basis']})")
    pubs = [st["c0"] + k + 1 for k in info["publication_steps"]]   # update counts published
    if pubs:
        shown = ", ".join(f"{u:,}" for u in pubs[:12]) + (", …" if len(pubs) > 12 else "")
        c.print(f"publications started at update {shown}: {st['publications']} of {len(pubs)} "
                "completed")


def _render_timing(c, info: dict) -> None:
    """The timestamp table's device step times and host gaps; the semaphores."""
    from rich import box
    from rich.table import Table
    st = info["status"]
    tm = info["timing"]
    t = Table(title="timing (timestamp table)", title_justify="left")
    for col in ("", "p50", "p99", "max", "n"):
        t.add_column(col, justify="right")
    t.add_row("device time per update step (ms)", _f(tm["device_step_ms_p50"], ".3f"),
              _f(tm["device_step_ms_p99"], ".3f"), _f(tm["device_step_ms_max"], ".3f"),
              f"{tm['updates_timed']:,}")
    t.add_row("host gap, fence → next issue (µs)", _f(tm["host_gap_us_p50"], ".1f"),
              _f(tm["host_gap_us_p99"], ".1f"), _f(tm["host_gap_us_max"], ".1f"),
              f"{max(info['issues'] - 1, 0):,}")
    c.print(t)

    t = Table(box=box.SIMPLE_HEAD, title=f"semaphores (gpGet {st['gp_get']:,}, gpPut {st['gp_put']:,})",
              title_justify="left")
    for col in ("submission", "final", "final ns", "pre-launch", "pre-launch ns"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in info["semaphores"]:
        t.add_row(s["submission"], str(s["final_payload"]), str(s["final_timestamp"]),
                  str(s["prelaunch_payload"]), str(s["prelaunch_timestamp"]))
    c.print(t)


def _render_records(c, info: dict) -> None:
    """The error notifier, the final predictions, the stat record, the warnings."""
    from rich.table import Table

    from .console import styled
    st, n = info["status"], info["error_notifier"]
    if n["status"]:
        from staging.layout import SUBMISSIONS
        from staging.records import NOTIFIER_NO_STEP
        step = "—" if n["step"] == NOTIFIER_NO_STEP else f"{n['step']:,}"
        sub = SUBMISSIONS[n["info16"]] if n["info16"] < len(SUBMISSIONS) else n["info16"]
        c.print(styled(("error notifier", "red"), f": {n['info_name']} (info32 {n['info32']:#x}), "
                       f"submission {sub}, sequence {n['sequence']:,}, step {step}: {n['reason']!r}"))
    else:
        c.print("error notifier: none")

    t = Table(title="final predictions", title_justify="left")
    for col in ("row", "token", "valid", "text"):
        t.add_column(col, justify="right" if col != "text" else "left")
    for p in st["predictions"]:
        t.add_row(str(p["row"]), str(p["token"]), str(p["valid"]),
                  "—" if p["text"] is None else repr(p["text"]))
    c.print(t)
    rows = "/".join(map(str, PREDICTION_ROWS))
    c.print(f"forward argmax (rows {rows}, before training): {info['forward_argmax']}; "
            f"final row {PREDICTION_ROWS[-1]} argmax {info['final_argmax']}")
    s = info["stat"]
    c.print(f"checkpoint input stat: dev {s['st_dev']} ino {s['st_ino']} size {s['st_size']:,} "
            f"mode {s['st_mode']:o} nlink {s['st_nlink']}, update count {s['update_count']:,}, "
            f"gpGet {s['gp_get']} gpPut {s['gp_put']} semaphore word {s['semaphore_word']}, "
            f"payload sha256 {s['payload_sha256'][:16]}…")
    c.print(f"last published checkpoint sha256 {st['checkpoint_sha256']}")
    for w in info["warnings"]:
        c.print(styled(("warning", "yellow"), f": {w}"))
