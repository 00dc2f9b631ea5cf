"""The device check's measurement phases: per-launch timing, the experiments, the calibration, the
sanitizer, torch.

Each phase is a function of a runner.Context (check.py orders them).  The
sanitizer runs `compute-sanitizer` where the machine has it; where it has not (the dry run) the
phase says so and still runs the commands beneath it.  The torch phases are capped: a bench
stopped at its cap leaves the rows it finished and the stage it was in (tools/bench_torch.py
writes its JSON as it goes), and the phase reports them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from tools.gpu_check.calibration_model import GUARD, RECORDED
from tools.gpu_check.commands import cli, cuda_tool, expect_run, production_run
from tools.gpu_check.report import fmt
from tools.gpu_check.runner import Context, PhaseTimeout

SANITIZER = "compute-sanitizer"
SANITIZER_DIRS = ("/usr/local/cuda/bin",)       # where a CUDA toolkit puts it off PATH
SANITIZER_ARGS = ("--print-limit", "20", "--error-exitcode", "86")
SANITIZER_EXIT = 86         # what --error-exitcode makes the exit code when it found errors
RACECHECK_LAUNCHES = r"^(attention|weight_grad)"    # matched against the launches' functions
REPORT_LINES = 12           # a sanitizer's first report lines quoted
BENCH = "tools.bench_torch"     # run with -m from the repository root
LAUNCHES = "tools.gpu_check.launches"
CALIBRATE = "tools.gpu_check.calibrate"
ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?")
HAZARDS = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, "
                     r"(\d+) warnings?\)")


def _summary_args(ctx: Context) -> list:
    m = ctx.mode
    args = ["--profile", m.production, "--repeats", m.launch_repeats,
            "--directory", ctx.check.streams]
    ref = production_run(ctx)
    if ref is not None:
        args += ["--checkpoint", ref.checkpoint]        # trained weights, not only the init
    return args


def phase_per_launch(ctx: Context) -> str:
    """The update's launches one by one outside the graph, each between events, and the graph."""
    m = ctx.mode
    rows = ctx.logs / "per_launch.json"
    args = [*_summary_args(ctx), "--json", rows, "--summary", ctx.logs / "summary.json",
            "--table", ctx.logs / "model-vs-measured.md"]
    t = ctx.sh("per-launch", cuda_tool(ctx, LAUNCHES, *args))
    ctx.require("per-launch timing", t.rc == 0, t)
    ctx.check.outdir.place("per_launch.json", rows)
    s = json.loads((ctx.logs / "summary.json").read_text())
    ctx.figures.update(s)
    ctx.expect("every launch timed", s["launches"] > 0 and s["repeats"] == m.launch_repeats)
    ctx.expect("the graph recaptured with every edge full was timed",
               s["full_edges_graph_us_p50"] is not None)
    ctx.expect("the driver took the programmatic edges", not s.get("programmatic_refused"),
               s.get("programmatic_refused"))
    pred = (s.get("predicted_update_us") or {}).get("central")
    full = (s.get("predicted_full_edges_update_us") or {}).get("central")
    return (f"{s['launches']} launches: sum {s['sum_of_launches_us']:.0f} µs, graph "
            f"{s['graph_us_p50']:.0f} µs ({s['programmatic_edges']} programmatic edges; all full "
            f"{s['full_edges_graph_us_p50']:.0f} µs), model {pred and round(pred)} µs central "
            f"(all full {full and round(full)}), {s['starved_repeats']} starved")


def phase_experiments(ctx: Context) -> str:
    """The capture variants' graphs side by side, the side lane alone, and the decisions."""
    path = ctx.logs / "experiments.json"
    t = ctx.sh("experiments", cuda_tool(ctx, LAUNCHES, *_summary_args(ctx),
                                        "--experiments", path))
    ctx.require("the experiments ran", t.rc == 0 and path.exists(), t)
    j = json.loads(path.read_text())
    ctx.check.report["experiments"] = j["experiments"]
    ctx.check.report["decisions"] = j["decisions"]
    ctx.figures.update(decisions=j["decisions"], predictions_unavailable=j["predictions_unavailable"],
                       repeats=j["repeats"])
    graphs = [r for r in j["experiments"] if r["graph_us"] is not None]
    ctx.expect("every capture variant replayed", graphs and all(r["graph_us"] > 0 for r in graphs),
               graphs)
    ctx.expect("every side-lane launch timed alone",
               all(r["per_launch_us"] is not None for r in j["experiments"]
                   if r["graph_us"] is None))
    return "; ".join(f"{d['name']}: {d['keep'] or d['why']}" for d in j["decisions"])


def calibration_summary(rows: list) -> str:
    """The table's line: each figure, the model's central beside it."""
    by = {r["name"]: r for r in rows}

    def x(name, short):
        r = by.get(name) or {}
        return f"{short} {fmt(r.get('measured'), '.3g')} ({fmt(r.get('central'), '.3g')})"
    return ("measured (model central): " + ", ".join([
        x("L2 read bandwidth", "L2 TB/s"), x("HBM read bandwidth", "HBM TB/s"),
        x("L2 hit latency, unloaded", "L2 µs"), x("L2 hit latency, loaded", "loaded"),
        x("HBM latency, unloaded", "HBM µs"), x("HBM latency, loaded", "loaded"),
        x("launch in a graph, full edge", "launch µs"),
        x("launch in a graph, programmatic edge", "programmatic"),
        x("dependent fp32 FMA", "FMA cycles"),
        x("two co-resident CTAs, latency-bound", "2 CTAs/SM ×"),
        x("two co-resident CTAs, issue-bound", "issue-bound ×")]))


def phase_calibration(ctx: Context) -> str:
    """The cost model's inputs measured by hand-written kernels (tools/gpu_check/calibrate.py),
    each beside the model's optimistic, central and pessimistic value."""
    path = ctx.logs / "calibration.json"
    t = ctx.sh("calibration", cuda_tool(ctx, CALIBRATE, "--json", path))
    ctx.require("the calibration wrote its figures", path.exists(), t)
    j = json.loads(path.read_text())
    ctx.check.report["calibration"] = j["rows"]
    ctx.figures.update(device=j.get("device"), model_unavailable=j["model_unavailable"],
                       experiment_seconds=j.get("seconds"), errors=j["errors"],
                       launch=j.get("launch"), chains=(j.get("chase") or {}).get("chains"))
    ctx.expect("every calibration experiment ran", t.rc == 0 and not j["errors"], t)
    for c in j["checks"]:
        ctx.expect(c["check"], c["ok"], c.get("detail"))
    no_pdl = "compute capability" in str((j.get("launch") or {}).get("programmatic_unavailable"))
    missing = [r["name"] for r in j["rows"] if r["measured"] is None
               and not (r["input"] == "LAUNCH_PDL" and no_pdl)]
    for recorded in (False, True):      # timed by events; read from what the kernels recorded
        which = [m for m in missing if (m in RECORDED) == recorded]
        ctx.expect("every figure the kernels record measured " + GUARD if recorded else
                   "every figure timed by events measured", not which, which)
    ctx.expect("the model's inputs read beside them (tools/cost/inputs.py)",
               j["model_unavailable"] is None, j["model_unavailable"])
    return calibration_summary(j["rows"])


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit's bin/ ($CUDA_HOME or SANITIZER_DIRS)."""
    found = shutil.which(SANITIZER)
    if found:
        return found
    home = os.environ.get("CUDA_HOME")
    for d in ((str(Path(home) / "bin"),) if home else ()) + SANITIZER_DIRS:
        p = Path(d) / SANITIZER
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def findings(text: str) -> dict:
    """A sanitizer's verdict from its output: error counts and its first report lines."""
    out = {}
    if m := ERRORS.search(text):
        out["errors"] = int(m.group(1))
    if m := HAZARDS.search(text):
        out.update(hazards=int(m.group(1)), errors=int(m.group(2)), warnings=int(m.group(3)))
    lines = [x for x in text.splitlines() if x.startswith("========= ")
             and "COMPUTE-SANITIZER" not in x and "SUMMARY" not in x]
    out["first_lines"] = lines[:REPORT_LINES]
    return out


def _sanitized(ctx: Context, tool: str | None, which: str, argv: list) -> list:
    return argv if tool is None else [tool, "--tool", which, *SANITIZER_ARGS, *argv]


def phase_sanitizer(ctx: Context) -> str:
    """memcheck over a few tiny steps; racecheck over each attention and weight-gradient kernel
    of the production profile, launched alone once."""
    m = ctx.mode
    tool = None if m.fake else sanitizer_path()
    ctx.figures["sanitizer"] = tool or (f"{SANITIZER} not found: the commands ran without it"
                                        + (" (the dry run: no GPU)" if m.fake else ""))
    d = ctx.work / "runs" / "sanitizer"
    d.mkdir(parents=True)
    ckpt, result = d / "tiny.ckpt", d / "result.bin"
    ckpt.write_bytes(b"")
    run = cli(ctx, "run", "--profile", "tiny", "--backend", m.backend, "--quiet",
              "--steps", m.sanitizer_steps, "--directory", ctx.check.streams,
              "--checkpoint", ckpt, "--result", result,
              "--fence-timeout", m.sanitizer_fence_timeout_s, needs_triton=m.backend == "interpret",
              computes=m.backend == "cuda")
    mem = ctx.sh("memcheck", _sanitized(ctx, tool, "memcheck", run))
    mem_found = findings(mem.text)
    expect_run(ctx, f"memcheck: {m.sanitizer_steps} tiny steps", mem, result)
    if tool is not None:
        ctx.expect("memcheck found no error", mem_found.get("errors") == 0, mem_found)
    alone = ctx.logs / "racecheck-launches.json"
    args = ["--profile", m.production, "--repeats", 1, "--directory", ctx.check.streams,
            "--only", RACECHECK_LAUNCHES, "--first-per-kernel", "--json", alone]
    ref = production_run(ctx)
    if ref is not None:
        args += ["--checkpoint", ref.checkpoint]
    argv = cuda_tool(ctx, LAUNCHES, *args)
    if not m.fake:      # under the sanitizer kernels run many times slower
        argv[argv.index("--fence-timeout") + 1] = m.sanitizer_fence_timeout_s
    race = ctx.sh("racecheck", _sanitized(ctx, tool, "racecheck", argv))
    race_found = findings(race.text)
    launched = json.loads(alone.read_text()) if alone.exists() else []
    ctx.expect("racecheck: the attention and weight-gradient launches ran",
               race.rc == 0 and bool(launched), race)
    if tool is not None:
        ctx.expect("racecheck found no hazard error", race_found.get("errors") == 0, race_found)
    ctx.figures.update(memcheck=mem_found, racecheck=race_found,
                       racecheck_launches=[r["label"] for r in launched])
    return (f"memcheck {mem_found.get('errors', '—')} errors, racecheck "
            f"{race_found.get('errors', '—')} errors / {race_found.get('warnings', '—')} warnings "
            f"over {len(launched)} launches" + ("" if tool else f" ({SANITIZER} absent)"))


def partial_bench(path: Path) -> dict:
    """What a bench's JSON holds so far: the stage it reached and the rows it finished."""
    try:
        j = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"stage": "not started (no JSON written)", "rows": []}
    return {"stage": j.get("stage"), "rows": j.get("rows", []), "json": j}


def _rows(j: dict) -> list:
    return [{k: r.get(k) for k in ("what", "ms_p50", "device_ms_p50", "ratio", "device_ratio",
                                   "compile_s", "agreement")} for r in j.get("rows", [])]


def _merge_bench(ctx: Context, j: dict) -> None:
    """bench.json: the Coppelius row once, then every torch variant of both phases."""
    merged = ctx.check.shared.setdefault("bench", {**j, "rows": j["rows"][:1]})
    merged["rows"] += j["rows"][1:]
    merged["agreement"] = {**merged.get("agreement", {}), **j.get("agreement", {})}
    ctx.check.outdir.place("bench.json", json.dumps(merged, indent=1).encode())


def _bench(ctx: Context, label: str, variants: str) -> str:
    m = ctx.mode
    path = ctx.logs / f"{label}.json"
    args = ["--steps", m.bench_steps, "--warmup", m.bench_warmup, "--device", m.torch_device,
            "--variants", variants, "--compile-backend", m.compile_backend,
            "--directory", ctx.check.streams, "--json", path,
            "--fence-timeout", m.fence_timeout_s]
    ref = production_run(ctx)
    if ref is not None:
        args += ["--result", ref.result]                # the production phase's Coppelius run
    else:
        args += ["--profile", m.production, "--backend", m.backend]
    try:
        t = ctx.sh(label, [sys.executable, "-m", BENCH, *args])
    except PhaseTimeout:
        got = partial_bench(path)
        ctx.figures.update(stage_reached=got["stage"], rows=_rows({"rows": got["rows"]}))
        if got["rows"][1:]:
            _merge_bench(ctx, got["json"])
        raise PhaseTimeout(f"stopped at its cap in stage {got['stage']!r} with "
                           f"{max(len(got['rows']) - 1, 0)} torch row(s) finished") from None
    got = partial_bench(path)
    if got["stage"] != "done":              # it ended early: what it reached is the figure
        ctx.figures.update(stage_reached=got["stage"], rows=_rows({"rows": got["rows"]}))
    ctx.require(f"bench_torch {variants} finished", got["stage"] == "done", t)
    j = got["json"]
    ctx.expect(f"loss agreement ≤ {j['agreement_atol']:g} over the first {j['agree_steps']} steps",
               t.rc == 0, t)
    _merge_bench(ctx, j)
    rows = _rows(j)
    ctx.figures.update(rows=rows, timing=j["timing"], steps=j["steps"], warmup=j["warmup"],
                       coppelius_source=j["coppelius"]["source"])
    return "; ".join(f"{r['what']} {fmt(r['ms_p50'])} ms (×{fmt(r['ratio'], '.2f')})"
                     for r in rows)


def phase_torch(ctx: Context) -> str:
    """PyTorch eager and torch.compile(mode="reduce-overhead") beside Coppelius."""
    return _bench(ctx, "bench", "eager,reduce-overhead")


def phase_torch_default(ctx: Context) -> str:
    """torch.compile's default mode."""
    return _bench(ctx, "bench-default", "default")
