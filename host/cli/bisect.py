"""`coppelius bisect A B`: the first launch of one update step whose outputs differ, from two
digests files (`coppelius run … --digests FILE`), and whether it diverged or inherited.

Bitwise (sha256 of every write region) by default; with `--across-backends` or `--atol/--rtol`
under tolerances.  Exit 0 when no launch differs, 1 when one does, 2 when a file cannot be read or
the two describe different computations (the field named).  The comparison is
`coppelius.forensics.compare_digests` (host/forensics/bisect.py); this module parses and renders.
"""
from __future__ import annotations

from coppelius.forensics.api import compare_digests, dumps
from coppelius.forensics.tolerances import DIGESTS_ACROSS_ATOL, DIGESTS_ACROSS_RTOL

ORDER = 35
EXIT_SAME, EXIT_DIFFERENT = 0, 1
LATER_SHOWN = 8                 # later differing launches named in the text report


def register(sub) -> None:
    p = sub.add_parser("bisect", help="name the first launch whose outputs differ between two "
                       "digests files",
                       description="Walk two digests files (coppelius run ... --digests FILE) in "
                       "launch order and name the first launch whose outputs differ: bitwise by "
                       "default, under tolerances across backends; for it the region, the max "
                       "abs/rel difference over the sample, the first differing sampled element, "
                       "and whether its inputs were still equal (it diverged) or not (it "
                       "inherited the difference). Exit 0 none differs, 1 one does, 2 the files "
                       "cannot be compared.")
    p.add_argument("a", metavar="A", help="first digests file (the reference)")
    p.add_argument("b", metavar="B", help="second digests file")
    p.add_argument("--atol", type=float, default=None,
                   help="tolerance relative to each region's largest |x| (default 0: bits must "
                   f"match; with --across-backends {DIGESTS_ACROSS_ATOL:g})")
    p.add_argument("--rtol", type=float, default=None,
                   help="tolerance relative to each element (default 0; with --across-backends "
                   f"{DIGESTS_ACROSS_RTOL:g}, one bf16 ulp)")
    p.add_argument("--across-backends", action="store_true",
                   help="compare under the default tolerances (two backends sum in other orders)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    report = compare_digests(args.a, args.b, args.atol, args.rtol, args.across_backends)
    if args.json:
        print(dumps(report))
    else:
        render(report)
    return EXIT_SAME if report["same"] else EXIT_DIFFERENT


def _file_line(k: str, s: dict) -> str:
    replay = "" if s["replay_matches_issue"] else "; its replay differs from its issued step"
    return (f"{k}: {s['path']} ({s['backend']}, {s['device']}, {s['target']}; {s['profile']} "
            f"update step {s['step']} from c0 {s['c0']}, context {s['context']}{replay})")


def _region_line(d: dict) -> str:
    where = f"{d['name']} → {d['space']}[{d['offset']}:+{d['count']}] {d['dtype']}"
    if "first_index" in d:
        return (f"  {where}: max |Δ| {d['max_abs']:.3g}, max rel {d['max_rel']:.3g} over the "
                f"sample; first differing sampled element {d['first_index']} "
                f"(A {d['a']}, B {d['b']})")
    if "max_abs" in d:
        return f"  {where}: differs outside the sample (sha256; stats {d['stats']})"
    return f"  {where}: differs (sha256; stats A/B {d['stats']})"


def render(rep: dict) -> None:
    from coppelius.cli.console import report_console, styled
    c = report_console()
    c.print(_file_line("A", rep["a"]))
    c.print(_file_line("B", rep["b"]))
    rule = ("bitwise (sha256)" if rep["bitwise"] else
            f"atol {rep['atol']:g} × each region's max |x|, rtol {rep['rtol']:g}")
    first = rep["first"]
    if first is None:
        c.print(styled((f"no launch differs: all {rep['launches']} launches' outputs equal",
                        "bold green"), f" ({rule})"))
        return
    c.print(styled((f"first divergent launch: #{first['index']} {first['label']}", "bold red"),
                   f" ({rule})"))
    lane = "main" if first["lane"] == 0 else "side"
    code = "same code" if first["code"]["same"] else \
        f"code differs: A {first['code']['a'][:12]}…, B {first['code']['b'][:12]}…"
    c.print(f"  kernel {first['function']} ({first['kernel']}), {lane} lane, {code}")
    if first["inputs_equal"]:
        c.print("  its inputs were equal: the kernel diverged")
    else:
        c.print("  its inputs already differed (" + ", ".join(first["inputs_differing"])
                + "): it inherited the difference from the state before the step")
    for d in first["regions"]:
        c.print(_region_line(d))
    later = rep["later"]
    if later:
        inherited = sum(x["verdict"] == "inherited" for x in later)
        c.print(f"then {len(later)} more launch(es) differ, {inherited} inheriting: "
                + ", ".join(f"#{x['index']} {x['label']}"
                            + ("" if x["verdict"] == "inherited" else " (diverged)")
                            for x in later[:LATER_SHOWN])
                + (" …" if len(later) > LATER_SHOWN else ""))
