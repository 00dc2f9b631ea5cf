"""`coppelius node`: the same run on every visible GPU at once, a verdict per GPU (docs/NODE.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = 15


def register(sub) -> None:
    from coppelius.node.children import DEFAULT_TIMEOUT_S
    from coppelius.telemetry import INTERVAL_S
    p = sub.add_parser("node", help="run on every visible GPU at once; a verdict per GPU",
                       description="One `coppelius run` process per visible GPU, each in its own "
                       "work directory from a fresh checkpoint, then PASS (bit for bit the "
                       "reference) or FAIL (the first difference, or how its process ended) per "
                       "GPU. Exit 0 all pass, 1 any fail (or a tie), 2 could not run.")
    p.add_argument("--profile", default="coppelius", help="coppelius (default) or tiny")
    p.add_argument("--backend", default="cuda", choices=["cuda", "interpret"],
                   help="cuda (default: every visible GPU) or interpret (--count CPU slots)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="a quick check: N steps per GPU (default the profile's)")
    p.add_argument("--expect", type=Path, metavar="FILE|DIR",
                   help="the known-good result file, or a directory of them (default: the "
                   "node's majority class; a tie is reported, never guessed)")
    p.add_argument("--work", type=Path, default=Path("coppelius-node"), metavar="DIR",
                   help="where each GPU's directory (gpu<i>/: checkpoint, result, run.log) and "
                   "the embedded stream go (default ./coppelius-node)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds per GPU before its run counts as hung and is killed "
                   f"(default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--digests", action="store_true",
                   help="each GPU also digests its first update launch by launch: a FAIL names "
                   "the first divergent kernel against a passing GPU (coppelius bisect)")
    p.add_argument("--soak", type=int, default=1, metavar="K",
                   help="each GPU replays its first update K times from one saved state; a "
                   "repetition that differs from the first is a transient fault (implies "
                   "--digests)")
    p.add_argument("--count", type=int, default=2, metavar="N",
                   help="interpret backend only: how many CPU slots (default 2)")
    p.add_argument("--telemetry-interval", type=float, default=INTERVAL_S, metavar="S",
                   help="seconds between telemetry samples while the runs go on (nvidia-ml-py; "
                   f"default {INTERVAL_S:g})")
    p.add_argument("--json", action="store_true", help="print the report as JSON (docs/NODE.md)")
    p.add_argument("--junit", type=Path, metavar="FILE",
                   help="also write JUnit XML: one test case per GPU")
    p.add_argument("--metrics", type=Path, metavar="FILE",
                   help="also write the verdicts as Prometheus metrics (prometheus-client; e.g. "
                   "node exporter's textfile directory, DIR/coppelius.prom; docs/NODE.md); a "
                   "file that cannot be written is one line on stderr, never a change of verdict "
                   "or exit status")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius.node import Invocation, junit_xml, run_node
    from coppelius.plan import profiles

    from coppelius.node.targets import NodeRefused
    profile = profiles.get(args.profile)        # an unknown profile: a refusal before any GPU
    if args.steps is not None and not 1 <= args.steps <= profile.steps:
        raise NodeRefused(f"--steps {args.steps} is outside 1..{profile.steps}",
                          f"the {profile.name} profile runs 1 to {profile.steps} steps")
    if args.soak < 1:
        raise NodeRefused(f"--soak {args.soak}: at least 1", "e.g. --soak 8")
    if args.junit is not None:      # before the runs: it replaces only a report of this command
        from coppelius.staging import paths
        paths.check_output(args.junit, "JUnit file", overwrite=True, exists_hint=None,
                           cls=NodeRefused, recognize=junit_recognize,
                           foreign_hint="name another --junit FILE")
    inv = Invocation(profile=args.profile, backend=args.backend, steps=args.steps,
                     work=args.work, timeout_s=args.timeout, digests=args.digests,
                     soak=args.soak)
    # checked before the runs, so an operator learns at once; the node is checked all the same
    metrics = args.metrics is not None and _metrics_ready(args.metrics)
    report = run_node(inv, expect=args.expect, count=args.count,
                      telemetry_interval_s=args.telemetry_interval)
    if args.junit is not None:
        args.junit.write_bytes(junit_xml(report))
    if metrics:
        _write_metrics(report, args.metrics)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return report["exit"]


JUNIT_SUITE = "coppelius node"      # how junit_xml names its test suite (host/node/report.py)


def junit_recognize(path) -> str | None:
    """None when the file at `path` is a JUnit report `coppelius node` wrote (or empty); else
    what it is instead: --junit never replaces another file."""
    import xml.etree.ElementTree as ET

    from coppelius.staging import paths
    from coppelius.staging.errors import UserError
    try:
        data = paths.read_regular(path, "JUnit file")
        if not data:
            return None
        root = ET.fromstring(data)
    except (UserError, ET.ParseError):
        return "it is not an XML file"
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if root.tag in ("testsuites", "testsuite") and suites and all(
            s.get("name", "").startswith(JUNIT_SUITE) for s in suites):
        return None
    return "it is no JUnit report of `coppelius node`"


def _metrics_refused(e) -> None:
    """A metrics file that cannot be written is one line on stderr: the verdicts and the exit
    status stay the GPUs' (a Prolog must not drain a node for its monitoring's sake)."""
    print(f"coppelius node: metrics not written (the verdicts stand): {e}", file=sys.stderr)


def _metrics_ready(path: Path) -> bool:
    from coppelius.node.metrics import MetricsRefused, check
    try:
        check(path)
    except MetricsRefused as e:
        _metrics_refused(e)
        return False
    return True


def _write_metrics(report: dict, path: Path) -> None:
    from coppelius.node.metrics import MetricsRefused, from_report, write
    try:
        write(from_report(report), path)
    except MetricsRefused as e:
        _metrics_refused(e)


def render(report: dict) -> None:
    from rich import box
    from rich.table import Table

    from coppelius.cli.console import report_console, styled

    c = report_console()
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False,
              title=f"coppelius node on {report['host']}: {report['profile']}, "
              f"{report['backend']}, {report['steps'] or 'all'} steps", title_justify="left")
    for col in ("GPU", "UUID", "PCI bus id", "verdict", "process", "s", "first difference / why"):
        t.add_column(col, justify="right" if col in ("GPU", "s") else "left")
    colours = {"PASS": "green", "FAIL": "red", "TIE": "yellow", "ERROR": "red"}
    for g in report["gpus"]:
        fd = g["first_difference"]
        why = f"{fd['section']}: {fd['where']}" if fd else ("" if g["verdict"] == "PASS"
                                                             else g["reason"])
        k = g.get("kernel") or {}
        if k.get("launch") is not None:
            why += f"; kernel #{k['launch']} {k['label']}"
        t.add_row(str(g["index"]), g["uuid"] or "—", g["pci_bus_id"] or "—",
                  styled((g["verdict"], colours[g["verdict"]])), g["process"]["status"],
                  f"{g['process']['wall_s']:.1f}", why)
    c.print(t)
    from coppelius.telemetry import summary_line
    tel = report["telemetry"]
    if not tel["available"]:
        c.print(tel["reason"])
    for g in report["gpus"] if tel["available"] else ():
        c.print(f"telemetry GPU {g['index']}: {summary_line(g['telemetry'] or [])}")
    n = report["counts"]
    c.print(f"{n['PASS']} pass, {n['FAIL']} fail, {n['TIE']} tie, {n['ERROR']} could not run; "
            f"exit {report['exit']}; per GPU: {report['work']}/<gpu>/run.log")
