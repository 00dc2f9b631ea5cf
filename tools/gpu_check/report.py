"""The device check's report: the machine it ran on, the short table the caller sees, report.md.

Plain functions over the report dict the check keeps (runner.py): no driver, no Triton."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from tools.gpu_check import figures

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "tiny-result-c0.bin"     # python -m tools.make_golden writes it


def _cmd(argv: list, timeout: float = 15) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_info() -> dict:
    from importlib import metadata
    versions = {}
    for name in ("torch", "triton", "numpy", "cuda-bindings", "cuda-python", "rich", "pytest",
                 "hypothesis"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    ptx = {}
    for manifest in sorted((ROOT / "kernels_ptx").glob("*/*/manifest.json")):
        ptx[str(manifest.parent.relative_to(ROOT / "kernels_ptx"))] = figures.file_sha256(manifest)[:16]
    mem = None
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines()
                    if x.startswith("MemTotal"))
        mem = round(int(line.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    return {"gpu": _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                         "clocks.max.sm,temperature.gpu,power.draw", "--format=csv,noheader"]),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "cpus": os.cpu_count(), "memory_gib": mem, "packages": versions,
            "git": _cmd(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], 5),
            "ptx_manifests_sha256": ptx,
            "golden_sha256": figures.file_sha256(GOLDEN)[:16] if GOLDEN.exists() else None}


def fmt(x, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def summary_table(report: dict) -> str:
    """The short table the caller sees (the last lines of stdout)."""
    rows = [f"{'phase':<14} {'status':<8} {'s':>6} {'pred':>5}  summary"]
    for p in report["phases"]:
        text = p.get("summary") if p["status"] == "ok" else p.get("reason", "")
        rows.append(f"{p['name']:<14} {p['status']:<8} {p['seconds']:>6.1f} "
                    f"{p['predicted_s']:>5.0f}  {(text or '')[:110]}")
    n = {s: sum(p["status"] == s for p in report["phases"]) for s in ("ok", "failed", "skipped")}
    rows.append(f"verdict ({report['mode']}): {n['ok']} ok, {n['failed']} failed, {n['skipped']} "
                f"skipped in {report['elapsed_s']:.0f} s (budget {report['budget_s']:.0f} s); "
                f"{out_line(report)}")
    return "\n".join(rows)


def out_line(report: dict) -> str:
    """What $OUT holds beside the check's own files, and what went into the logs instead."""
    o = report.get("out", {})
    text = "files in $OUT: report.md report.json logs.tar.gz and the phases' own"
    if o.get("foreign"):
        text += f"; not the check's (counted against {o['limit']}): {', '.join(o['foreign'])}"
    if o.get("held_back"):
        text += f"; in logs.tar.gz (logs/held-back/) for want of a slot: {', '.join(o['held_back'])}"
    return text


def experiments_markdown(report: dict) -> list[str]:
    """The experiments side by side, then what the plan should keep."""
    rows = report.get("experiments")
    if not rows:
        return []
    out = ["", "## Experiments (graph replays of capture variants)", "",
           "| experiment | variant | graph µs | per launch µs | predicted µs |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['name']} | {r['variant']} | {fmt(r['graph_us'], '.1f')} | "
                   f"{fmt(r['per_launch_us'], '.1f')} | {fmt(r.get('predicted_us'), '.1f')} |")
    out += ["", "What the plan should keep:", ""]
    for d in report.get("decisions", []):
        out.append(f"- {d['name']}: **{d['keep'] or '—'}** — {d['why']}")
    return out


def calibration_markdown(report: dict) -> list[str]:
    """Each calibration figure beside the cost model's input it calibrates."""
    rows = report.get("calibration")
    if not rows:
        return []
    out = ["", "## Calibration (the cost model's inputs, measured)", "",
           "| what | input | measured | optimistic | central | pessimistic | unit | within | how |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        within = "—" if r.get("within") is None else ("yes" if r["within"] else "**no**")
        out.append(f"| {r['name']} | `{r['input']}` | {fmt(r['measured'], '.4g')} | "
                   f"{fmt(r.get('optimistic'), '.4g')} | {fmt(r.get('central'), '.4g')} | "
                   f"{fmt(r.get('pessimistic'), '.4g')} | {r['unit']} | {within} | {r['how']} |")
    return out


def report_markdown(report: dict) -> str:
    m = report["machine"]
    out = [f"# Coppelius device check ({report['mode']}) — {report['started_utc']}", "",
           f"- GPU: {m['gpu'] or 'none (nvidia-smi absent or failed)'}",
           f"- python {m['python']} on {m['platform']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; "
           + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v),
           f"- checkout {m['git'] or '(no git)'}; PTX manifests "
           + ", ".join(f"{k} {v}" for k, v in m["ptx_manifests_sha256"].items()),
           f"- budget {report['budget_s']:.0f} s, elapsed {report['elapsed_s']:.0f} s; profile of "
           f"the production phases: {report.get('profile')}",
           f"- {out_line(report)}", "",
           "| phase | status | seconds | predicted | summary |", "|---|---|---|---|---|"]
    for p in report["phases"]:
        text = p.get("summary") if p["status"] == "ok" else p.get("reason", "")
        out.append(f"| {p['title']} | {p['status']} | {p['seconds']:.1f} | {p['predicted_s']:.0f} "
                   f"| {(text or '').replace('|', '/')} |")
    for p in report["phases"]:
        if p["status"] == "skipped":
            continue
        out += ["", f"## {p['title']}", ""]
        for c in p.get("checks", []):
            out.append(f"- {'ok' if c['ok'] else '**FAILED**'}: {c['check']}"
                       + (f" (exit {c['rc']}, {c['seconds']} s, {c['log']})" if "rc" in c else ""))
            if not c["ok"] and c.get("tail"):
                out += ["", "```", c["tail"][-1500:], "```"]
        figures = {k: v for k, v in p.items() if k not in (
            "name", "title", "status", "checks", "summary", "reason", "function_table", "top")}
        out += ["", "```json", json.dumps(figures, indent=1, default=str, ensure_ascii=False)[:6000],
                "```"]
        for r in p.get("top", [])[:12]:
            if r is p.get("top", [])[0]:
                out += ["", "| launch | kernel | measured µs | central µs | ratio | binds |",
                        "|---|---|---|---|---|---|"]
            pred = (r.get("predicted_us") or {}).get("central")
            out.append(f"| {r['label']} | {r['kernel']} | {fmt(r['us'], '.1f')} | "
                       f"{fmt(pred, '.1f')} | {fmt(r.get('ratio_central'), '.2f')} | "
                       f"{r.get('binding') or '—'} |")
    out += experiments_markdown(report)
    out += calibration_markdown(report)
    return "\n".join(out) + "\n"
