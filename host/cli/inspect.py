"""`coppelius inspect RESULT [--json] [--plot PNG]`: result-file forensics, every section decoded.

The command: arguments, the plot, the JSON or the text report; what it shows is
`coppelius.forensics.summary.summarize`."""
from __future__ import annotations

import errno
import json
import os
import sys

import numpy as np

from coppelius.plan.profiles import PREDICTION_ROWS

from coppelius.forensics.summary import LAST_N, STREAM_CHOICES, run_levels, stream_used, summarize

ORDER = 20
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
TELEMETRY_ROWS = 24     # samples shown whole; a longer run shows its first and last half of them


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
    from coppelius.staging import paths

    from coppelius.results import reader as RF
    if args.plot:                # refuse a plot path that cannot be written before the work
        from coppelius.forensics.plot import recognize
        # a plot replaces a plot it wrote, never another file (the result file, an image)
        paths.check_output(args.plot, "plot", overwrite=True, exists_hint=None,
                           recognize=recognize, foreign_hint="name another --plot PNG")
    rf = RF.read(args.result)
    stream = stream_used(rf, args.stream)
    if args.plot:
        from coppelius.forensics.plot import plot
        plot(rf, args.plot, levels=run_levels(rf, stream))
    info = summarize(rf, stream)            # the telemetry file beside it included
    try:
        if args.json:
            json.dump(info, sys.stdout, allow_nan=False, separators=(",", ":"))
            sys.stdout.write("\n")
        else:
            render(info, rf)
            if args.plot:
                print(f"plot written to {args.plot}")
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    return 0


def _broken_pipe() -> None:
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _reader_gone() -> int:
    """`inspect … | head`: the reader closed the pipe after what it wanted; that is success, and
    nothing more is written (stdout goes to /dev/null, so the exit's flush cannot fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


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
    from coppelius.cli.console import report_console
    c = report_console()
    c.on_broken_pipe = _broken_pipe     # rich would exit 1; `run` ends quietly with 0 instead
    _render_identity(c, info)
    _render_losses(c, info, rf)
    _render_timing(c, info)
    _render_telemetry(c, info)
    _render_records(c, info)


def _render_identity(c, info: dict) -> None:
    """The path, profile and outcome; the size against the formula; the status block's run."""
    from coppelius.cli.console import styled
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
    ran = info["ran_on"]
    c.print(f"status block version {st['version']}: host {ran['host_name'] or '—'}, GPU "
            f"{ran['gpu_uuid'] or '—'}, PCI bus id {ran['pci_bus_id'] or '—'}"
            + (" (version 1 records neither)" if st["version"] == 1 else ""))


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
    t.add_row("host gap, fence → next update issue (µs)", _f(tm["host_gap_us_p50"], ".1f"),
              _f(tm["host_gap_us_p99"], ".1f"), _f(tm["host_gap_us_max"], ".1f"),
              f"{tm['host_gaps_timed']:,}")
    c.print(t)

    t = Table(box=box.SIMPLE_HEAD, title=f"semaphores (gpGet {st['gp_get']:,}, gpPut {st['gp_put']:,})",
              title_justify="left")
    for col in ("submission", "final", "final ns", "pre-launch", "pre-launch ns"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in info["semaphores"]:
        t.add_row(s["submission"], str(s["final_payload"]), str(s["final_timestamp"]),
                  str(s["prelaunch_payload"]), str(s["prelaunch_timestamp"]))
    c.print(t)


def _render_telemetry(c, info: dict) -> None:
    """The telemetry file beside the result (one row per sample, then the summary line), why
    there is none, or nothing where it is unreadable (the warnings at the end name it)."""
    from rich import box
    from rich.table import Table

    from coppelius.telemetry import READINGS, UNAVAILABLE
    tel = info["telemetry"]
    if tel is None:
        from coppelius.results.telemetry_file import path_for
        c.print(f"no telemetry recorded (no {path_for(info['path']).name} beside the file: a run "
                "on the cuda backend writes it)")
        return
    if tel["error"]:
        return
    if not tel["available"]:
        c.print(tel["reason"] or UNAVAILABLE)       # "telemetry unavailable: " and why
        return
    gpu, samples = tel["gpu"], tel["samples"]
    t = Table(box=box.SIMPLE_HEAD, title_justify="left",
              title=f"telemetry of GPU {gpu['index']} {gpu['uuid'] or '—'} "
              f"({gpu['pci_bus_id']}) on {tel['host']}: {len(samples)} samples")
    heads = ("phase", "update", "t (s)", "°C", "W", "SM MHz", "mem MHz", "throttle",
             "ECC corr.", "ECC uncorr.", "pages pending", "remap pending", "remap failure")
    for col in heads:
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    shown = samples if len(samples) <= TELEMETRY_ROWS else \
        samples[:TELEMETRY_ROWS // 2] + [None] + samples[-(TELEMETRY_ROWS // 2):]
    for s in shown:
        if s is None:
            t.add_row("…", *[""] * (len(heads) - 1))
            continue
        r = s["readings"]
        cells = ["—" if r[k] is None else (f"{r[k]:#x}" if k == "throttle_reasons" else
                                          f"{r[k]:g}") for k in READINGS]
        t.add_row(s["phase"], f"{s['update_count']:,}", f"{s['t_s']:.1f}", *cells)
    c.print(t)
    c.print(f"telemetry: {tel['summary']}")


def _unlinked(stat: dict) -> str:
    """What nlink 0 means: the stat record is taken after the run, and the input file (a fresh
    start's empty checkpoint, or the loaded one) was replaced by the run's first publication."""
    if stat["st_nlink"]:
        return ""
    return (" (the input file as opened; the run's publication replaced it under its name)")


def _render_records(c, info: dict) -> None:
    """The error notifier, the final predictions, the stat record, the warnings."""
    from rich.table import Table

    from coppelius.cli.console import styled
    st, n = info["status"], info["error_notifier"]
    if n["status"]:
        from coppelius.staging.layout import SUBMISSIONS
        from coppelius.staging.records import NOTIFIER_NO_STEP
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
            f"mode {s['st_mode']:o} nlink {s['st_nlink']}{_unlinked(s)}, update count "
            f"{s['update_count']:,}, "
            f"gpGet {s['gp_get']} gpPut {s['gp_put']} semaphore word {s['semaphore_word']}, "
            f"payload sha256 {s['payload_sha256'][:16]}…")
    c.print(f"last published checkpoint sha256 {info['checkpoint_digest']}"
            + (" (its first 8 bytes: status block version 2)" if st["version"] != 1 else ""))
    for w in info["warnings"]:
        c.print(styled(("warning", "yellow"), f": {w}"))
