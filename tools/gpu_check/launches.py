"""Per-launch device time of the update submission on the cuda backend, beside the H200 cost model.

  python3 -m tools.gpu_check.launches --profile coppelius [--checkpoint CKPT] --repeats 30 \
      --json per_launch.json --summary summary.json [--table table.md]
  python3 -m tools.gpu_check.launches ... --experiments experiments.json     # capture variants
  python3 -m tools.gpu_check.launches ... --only 'attention|weight_grad' --first-per-kernel \
      --repeats 1 --json alone.json                 # those launches alone (under a sanitizer)

Opens the cuda backend as a run does, loads the payload (CKPT, or the fresh initialization), runs
one forward and one update through the ring (the run's own protocol), then replays the update's
launch list outside its graph with an event between launches (`CudaBackend.time_submission`).
The graph is timed twice: as the run captures it (programmatic edges on sm_90a) and recaptured
with every edge full (`CudaBackend(pdl=False)`), so the summary shows what the programmatic edges
save beside the model's LAUNCH_PDL prediction of it.

`--json` is the list `python -m tools.build_ptx --report --measured FILE` reads: one {label, kernel, us}
per launch (us: the median over the repeats), with the prediction beside it.  The predictions are
computed here, from the registers the driver reports for each loaded function: those are the
registers the timed code runs with, the device image may have no ptxas (or another version than
the driver's JIT), and a committed prediction file would go stale whenever the kernels change.
Any launch list the plan builds is timed: no label or count is assumed.

`--experiments FILE` replays the update's graph in every capture variant of
experiments.py (programmatic edges or all full, two lanes or one, the side lane or
a no-op kernel in its place, the plan's priority lane first or no stream priority) and times
each side-lane launch alone; FILE gets the rows, the predictions beside them, the decisions and
the device's stream priorities (its range, each lane's, or why there are none).  `--only REGEX`
times just the update launches whose label or function matches, each alone on an idle GPU, with
no ring run and no graph replay: what the device check runs under `compute-sanitizer --tool
racecheck`.  Every fence waits at most
`--fence-timeout` seconds.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from coppelius import checkpoints as ckpt
from coppelius.backends.cuda.backend import CudaBackend
from coppelius.run.ring import DEFAULT_FENCE_TIMEOUT_S, Ring
from coppelius.plan import launches, profiles, reference
from coppelius.staging import layout as L
from coppelius.staging import synthetic
from coppelius.staging.tokens import TokenCache

TOP_N = 12              # launches shown in the summary's table, the longest measured first


def load_payload(backend, profile, checkpoint: Path | None) -> int:
    """The payload onto the device as a run loads it; returns its update count (c0)."""
    if checkpoint is None:
        backend.upload_payload(reference.init_parameters(profile).view(np.uint8))
        return 0
    with ckpt.open_input(checkpoint, profile) as inp:
        if inp.fresh:
            backend.upload_payload(reference.init_parameters(profile).view(np.uint8))
            return 0
        inp.load_chunks(lambda off, view: backend.upload_chunk(off, len(view)),
                        transfer=backend.staging.transfer)
        return inp.update_count


def predictions(profile, backend) -> tuple[dict, str | None]:
    """label -> the cost model's LaunchCost, from the driver-reported registers; or ({}, why)."""
    try:
        from tools.cost.kernel_stats import KernelStats
        from tools.cost.per_launch import model
        stats = {key: KernelStats(regs=k.attributes.registers, shared=k.shared, threads=k.threads,
                                  spill=sum(k.spills or (0, 0)), pdl=k.pdl)
                 for key, k in backend.kernels.items()}
        return {c.label: c for c in model(profile, "update", stats)}, None
    except Exception as e:      # a kernel family the model does not know yet: measure anyway
        return {}, f"{type(e).__name__}: {e}"


@contextmanager
def opened(profile, checkpoint: Path | None, directory: Path, fence_timeout_s: float,
           warm: bool = True):
    """The cuda backend with the payload loaded and the graphs captured as a run captures them;
    `warm`: one forward and one update through the ring (the run's protocol, every fence bounded
    by `fence_timeout_s`), so the buffers hold a state an update leaves.  -> (backend, c0)."""
    tokens = synthetic.ensure_default_stream(profile, directory)
    cache = TokenCache.open(tokens, profile)
    with CudaBackend(profile) as backend:
        c0 = load_payload(backend, profile, checkpoint)
        cache.validate_run(c0, 1)
        backend.instantiate(t_base=c0 - 1)
        if warm:
            ring = Ring(backend, capacity=2, timeout_s=fence_timeout_s)
            cache.write_input_record(backend.staging, c0)
            ring.run(L.SUBMISSION_FORWARD, c0, None)        # w16 and every buffer a valid state
            ring.run(L.SUBMISSION_UPDATE, c0, 0)
        yield backend, c0


def measure(profile, checkpoint: Path | None, repeats: int, directory: Path,
            fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S):
    with opened(profile, checkpoint, directory, fence_timeout_s) as (backend, c0):
        timing = backend.time_submission(L.SUBMISSION_UPDATE, repeats)
        timing.programmatic_edges = backend.programmatic_edges[L.SUBMISSION_UPDATE]
        timing.pdl_refused = backend.pdl_refused         # the driver's refusal, if any
        # the same graph with every edge full: what the programmatic edges save, measured
        backend.pdl = False
        backend.instantiate(t_base=c0 - 1)
        full = backend.time_submission(L.SUBMISSION_UPDATE, repeats)
        timing.full_edges_graph_us = full.graph_us
        costs, why = predictions(profile, backend)
        info = backend.device()
    return timing, costs, why, info, c0


def chosen(profile, pattern: str, first_per_kernel: bool) -> list[int]:
    """Update launches whose label or function matches `pattern` (a regex, searched); with
    `first_per_kernel` only the first launch of each compiled kernel (the others differ in
    their pointers alone)."""
    rx = re.compile(pattern)
    update = launches.submissions(profile)[L.SUBMISSION_UPDATE].launches
    out, seen = [], set()
    for i, x in enumerate(update):
        if (rx.search(x.label) or rx.search(x.function)) and not (first_per_kernel
                                                                   and x.kernel in seen):
            out.append(i)
            seen.add(x.kernel)
    if not out:
        raise SystemExit(f"--only {pattern!r}: no update launch matches; labels are like "
                         f"{update[1].label!r}, functions like {update[1].function!r}")
    return out


def run_only(a, profile) -> int:
    """The chosen launches alone (no ring, no graph replay): their {label, kernel, us} rows."""
    indices = chosen(profile, a.only, a.first_per_kernel)
    with opened(profile, a.checkpoint, a.directory, a.fence_timeout, warm=False) as (b, c0):
        alone = b.time_alone(L.SUBMISSION_UPDATE, indices, a.repeats)
        info = b.device()
    update = launches.submissions(profile)[L.SUBMISSION_UPDATE].launches
    rows = [{"label": update[i].label, "kernel": update[i].kernel,
             "us": _r(statistics.median(t))} for i, t in zip(indices, alone)]
    a.json.write_text(json.dumps(rows, indent=1))
    print(f"{profile.name} update on {info.name}: {len(rows)} launches alone, {a.repeats} "
          f"repeat(s): " + ", ".join(f"{r['label']} {r['us']:.1f} µs" for r in rows))
    return 0


def run_experiments(a, profile) -> int:
    """Every capture variant's graph, the side lane alone, predictions and decisions."""
    from tools.gpu_check import experiments as X
    with opened(profile, a.checkpoint, a.directory, a.fence_timeout) as (b, c0):
        graphs = X.measure_graphs(b, c0 - 1, a.repeats)
        alone = b.time_alone(L.SUBMISSION_UPDATE, X.side_lane(profile), a.repeats)
        costs, why = predictions(profile, b)
        kernel_pdl = {key: k.pdl for key, k in b.kernels.items()}
        info = b.device()
        priorities = {"range": b.priority_range, "note": b.priority_note,
                      "lanes": {"main" if lane == launches.MAIN_LANE else "side": p
                                for lane, p in b.lane_priorities.items()}}
    rows = X.rows(profile, graphs, alone, costs, X.predicted(profile, costs, kernel_pdl))
    decisions = X.decide(rows)
    a.experiments.write_text(json.dumps({
        "profile": profile.name, "device": info.name, "target": info.target, "c0": c0,
        "repeats": a.repeats, "scenario": X.SCENARIO, "predictions_unavailable": why,
        "experiments": rows, "decisions": decisions, "stream_priorities": priorities}, indent=1))
    for d in decisions:
        print(f"{d['name']}: {d['keep'] or '—'}: {d['why']}")
    return 0


def _r(x) -> float:
    return round(float(x), 3)


def tables(timing, costs: dict, lane: dict | None = None):
    """(per-launch rows for --json, summary dict); `lane`: the cost model's two-lane graph."""
    per = np.asarray(timing.launch_us, np.float64)                  # (repeats, launches)
    med = np.median(per, axis=0)
    rows = []
    for i, (label, kernel) in enumerate(zip(timing.labels, timing.kernels)):
        row = {"label": label, "kernel": kernel, "us": _r(med[i]),
               "us_min": _r(per[:, i].min()), "us_max": _r(per[:, i].max())}
        c = costs.get(label)
        if c is not None:
            row.update(predicted_us={s: _r(x) for s, x in c.us.items()},
                       binding=c.binding["central"], ratio_central=_r(med[i] / c.us["central"]))
        rows.append(row)
    graph = statistics.median(timing.graph_us)
    summed = float(med.sum())
    scenarios = ("optimistic", "central", "pessimistic")
    # the launches replayed one by one are timed against the model's serial sum; the graph replay
    # (two lanes, tools/cost/lanes.py) against the model's graph time
    serial = {s: _r(sum(c.us[s] for c in costs.values())) for s in scenarios} if costs else None
    graph_model = ({s: _r(lane[s]["graph_us"]) for s in scenarios} if costs and lane else None)
    top = sorted(rows, key=lambda r: -r["us"])[:TOP_N]
    summary = {"launches": len(rows), "repeats": len(timing.graph_us), "lead_replays": timing.lead,
               "sum_of_launches_us": _r(summed), "graph_us_p50": _r(graph),
               "graph_us_min": _r(min(timing.graph_us)),
               "graph_over_sum": _r(graph / summed) if summed else None,
               "enqueue_us_p50": _r(statistics.median(timing.enqueue_us)),
               "lead_us_p50": _r(statistics.median(timing.lead_us)),
               "starved_repeats": timing.starved, "predicted_update_us": graph_model,
               "programmatic_edges": timing.programmatic_edges,
               "programmatic_refused": timing.pdl_refused,
               "full_edges_graph_us_p50": (_r(statistics.median(timing.full_edges_graph_us))
                                           if timing.full_edges_graph_us else None),
               "predicted_full_edges_update_us": ({s: _r(lane[s]["full_edges_graph_us"])
                                                   for s in scenarios} if costs and lane else None),
               "predicted_serial_sum_us": serial,
               "top": [{k: r.get(k) for k in ("label", "kernel", "us", "predicted_us", "binding",
                                                "ratio_central")} for r in top]}
    return rows, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="coppelius", choices=profiles.names())
    ap.add_argument("--checkpoint", type=Path, help="payload to time with (default: fresh init)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--directory", type=Path, default=Path(synthetic.DEFAULT_DIRECTORY),
                    help="where the embedded stream is cached")
    ap.add_argument("--json", type=Path, help="per-launch list ({label, kernel, us}); needed "
                    "unless --experiments")
    ap.add_argument("--summary", type=Path, help="totals, graph vs launches, the longest launches")
    ap.add_argument("--table", type=Path, help="the cost model's model-vs-measured table (markdown)")
    ap.add_argument("--fence-timeout", type=float, default=DEFAULT_FENCE_TIMEOUT_S, metavar="S",
                    help=f"seconds to wait for a fence (default {DEFAULT_FENCE_TIMEOUT_S:g})")
    ap.add_argument("--experiments", type=Path, metavar="FILE",
                    help="time the capture variants and the side lane alone instead; write FILE")
    ap.add_argument("--only", metavar="REGEX", help="time only the update launches whose label or "
                    "function matches, each alone, no ring or graph (for a sanitizer)")
    ap.add_argument("--first-per-kernel", action="store_true",
                    help="with --only: the first launch of each compiled kernel only")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    if a.json is None and a.experiments is None:
        ap.error("--json FILE is needed (or --experiments FILE)")
    if a.first_per_kernel and not a.only:
        ap.error("--first-per-kernel goes with --only")
    profile = profiles.get(a.profile)
    if a.experiments:
        return run_experiments(a, profile)
    if a.only:
        return run_only(a, profile)
    timing, costs, why, info, c0 = measure(profile, a.checkpoint, a.repeats, a.directory,
                                           a.fence_timeout)
    lane = None
    if costs:
        from tools.cost.lanes import replay
        lane = replay(profile, "update", list(costs.values()))
    rows, summary = tables(timing, costs, lane)
    summary.update(profile=profile.name, target=info.target, device=info.name, c0=c0,
                   registers="driver (cuFuncGetAttribute NUM_REGS of the loaded functions)",
                   predictions_unavailable=why)
    a.json.write_text(json.dumps(rows, indent=1))
    if costs:
        from tools.cost.measured import compare, read_measured
        text = compare(list(costs.values()), read_measured(a.json))
    else:
        text = f"no predictions: {why}"
    if a.table:
        a.table.write_text(text + "\n")
    if a.summary:
        a.summary.write_text(json.dumps(summary, indent=1))
    print(f"{profile.name} update, {len(rows)} launches on {info.name} ({info.target}), "
          f"{summary['repeats']} repeats: sum of launches {summary['sum_of_launches_us']:.1f} µs, "
          f"graph replay {summary['graph_us_p50']:.1f} µs (p50), {summary['starved_repeats']} "
          f"starved repeats; with every edge full {summary['full_edges_graph_us_p50']} µs "
          f"({summary['programmatic_edges']} programmatic edges in the first)")
    if summary["predicted_update_us"]:
        print(f"cost model (driver registers), central: graph {summary['predicted_update_us']['central']:.1f} µs, "
              f"launches one by one {summary['predicted_serial_sum_us']['central']:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
