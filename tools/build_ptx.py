"""Build kernels_ptx/<profile>/<target>/ (CONTRACT §12): Triton ahead-of-time → PTX for every kernel
the launch lists name, the hand-written PTX (release, release_stage_in), and a manifest.json per
directory.

  .venv/bin/python -m tools.build_ptx [--out DIR] [--profile P ...] [--target T ...] [--jobs N]
  .venv/bin/python -m tools.build_ptx --check     # rebuild in a temporary directory, compare with
                                                  # kernels_ptx/ (or --out) byte for byte
  .venv/bin/python -m tools.build_ptx --report [--json] [--measured FILE]    # the cost model

No GPU is needed.  Pinned: Triton 3.9.0, PTX ISA 8.0 (`.version 8.0`, what CUDA 12.0 drivers and
later accept; sm_90a's wgmma needs exactly 8.0), no line info, no FMA contraction (the interpreter
and the reference have none either).  Same sources → same bytes: the PTX carries no paths, dates
or debug info, and each worker compiles into a fresh Triton cache.

manifest.json: {"profile", "target", "triton", "ptx_isa", "fp_fusion", "kernels": {entry: {
"file", "sha256" (of the PTX file's bytes, checked by host/backends/cuda/ptx.py at load), "entry" (the PTX
.entry symbol), "module", "function", "params": [{"name", "type", "hidden"}], "threads",
"shared" (dynamic shared memory bytes), "num_warps", "num_stages", "global_scratch": {"size",
"align"}, "profile_scratch": {"size", "align"}, "constexprs", "divisible_by_16": [parameter
names], "pdl" (the kernel waits for the grids before it first: it may be launched with
programmatic stream serialization; true for every Triton kernel on sm_90a)}}}.  Triton appends two hidden pointer parameters
(global and profile scratch) to every kernel: they are listed with "hidden": true and are passed
as null when their size is 0.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from coppelius.plan import launches, profiles  # plain data: no Triton in this process

ROOT = Path(__file__).resolve().parent.parent

TRITON_VERSION = "3.9.0"
PTX_ISA = (8, 0)
TARGETS = {"sm_90a": 90, "sm_80": 80}
PDL_MIN_CC = 90         # griddepcontrol (programmatic dependent launch) needs sm_90 or later
PDL_PARAM = "PDL"       # the constexpr every Triton kernel takes (plan/kernels/grid_dependency.py)
HIDDEN_PARAMS = ("global_scratch", "profile_scratch")
HAND_SOURCES = ROOT / "plan" / "kernels"          # <function>.ptx for launches.HAND_WRITTEN
DEFAULT_OUT = ROOT / "kernels_ptx"


def _no_cubin(*args):
    """Triton stage hook: stop at PTX (the host loads PTX only; tests/tools/test_ptx.py runs ptxas)."""
    if not args:
        return "coppelius-ptx-only", "0"
    stages = args[1]
    stages["cubin"] = lambda src, metadata: b""


def worker_init():
    """A compiling process's environment (a pool's initializer): Triton compiles, not interprets,
    with no line info and no FMA contraction, into a fresh cache, and stops at PTX."""
    os.environ["TRITON_INTERPRET"] = "0"           # the test process may have set it
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="coppelius-triton-")
    from triton import knobs
    knobs.runtime.add_stages_inspection_hook = _no_cubin


def _clean_ptx(ptx: str) -> str:
    # belt and braces: no debug sections, .file/.loc lines or trailing spaces can vary per machine
    debug = re.compile(r"^\s*\.(loc|file)\s")          # not `.local`: that declares stack memory
    lines = [ln.rstrip() for ln in ptx.splitlines() if not debug.match(ln)]
    text = "\n".join(lines) + "\n"
    return re.sub(r"\n\t\.section\s+\.debug\w*\s*\{.*?\n\t\}", "", text, flags=re.S)


def compile_entry(job):
    """(target, Launch) → (entry, ptx, manifest record).  Runs in a worker process."""
    target, launch = job
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if triton.__version__ != TRITON_VERSION:
        raise SystemExit(f"Triton {triton.__version__} installed; the committed PTX is built with "
                         f"{TRITON_VERSION} (pip install triton=={TRITON_VERSION})")
    fn = getattr(importlib.import_module(launch.module), launch.function)
    names = list(fn.arg_names)
    if PDL_PARAM not in names:
        raise ValueError(f"{launch.kernel}: {launch.function} takes no {PDL_PARAM} constexpr; hint: "
                         "end its parameters with PDL: tl.constexpr = False and make "
                         "await_previous_grid(PDL) its first statement")
    pdl = TARGETS[target] >= PDL_MIN_CC
    constexprs = dict(launch.constexprs, **{PDL_PARAM: pdl})
    given = [n for n, _ in launch.args] + list(constexprs)
    if sorted(given) != sorted(names):
        raise ValueError(f"{launch.kernel}: launch names {given}, kernel takes {names}")
    args = dict(launch.args)
    if [n for n in names if n in args] != [n for n, _ in launch.args]:
        raise ValueError(f"{launch.kernel}: launch arguments out of the kernel's parameter order")
    signature = {n: (args[n].signature if n in args else "constexpr") for n in names}
    divisible = [launch.args[i][0] for i in launches.specialization(launch.args)]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages,
               "ptx_version": PTX_ISA[0] * 10 + PTX_ISA[1], "enable_fp_fusion": False}
    compiled = triton.compile(src, target=GPUTarget("cuda", TARGETS[target], 32), options=options)
    md = compiled.metadata
    ptx = _clean_ptx(compiled.asm["ptx"])
    entry = re.search(r"\.visible \.entry \w+\((.*?)\)", ptx, flags=re.S)
    declared = re.findall(r"\.param ", entry.group(1)) if entry else []
    params = [{"name": n, "type": args[n].signature, "hidden": False} for n, _ in launch.args]
    params += [{"name": h, "type": "*i8", "hidden": True} for h in HIDDEN_PARAMS]
    if len(declared) != len(params):
        raise ValueError(f"{launch.kernel}: PTX declares {len(declared)} parameters, "
                         f"expected {len(params)} ({[p['name'] for p in params]})")
    record = {
        "file": f"{launch.kernel}.ptx", "entry": md.name, "module": launch.module,
        "function": launch.function, "params": params, "threads": md.num_warps * 32,
        "shared": md.shared, "num_warps": md.num_warps, "num_stages": launch.num_stages,
        "global_scratch": {"size": md.global_scratch_size, "align": md.global_scratch_align},
        "profile_scratch": {"size": md.profile_scratch_size, "align": md.profile_scratch_align},
        "constexprs": {k: v for k, v in launch.constexprs}, "divisible_by_16": divisible,
        "pdl": pdl,
    }
    return launch.kernel, ptx, record


def hand_ptx(function: str, target: str) -> str:
    """A hand-written kernel's PTX for `target` (its .target and .version lines rewritten)."""
    source = HAND_SOURCES / f"{function}.ptx"
    text = source.read_text(encoding="ascii")
    text, n = re.subn(r"^\.target \w+$", f".target {target}", text, flags=re.M)
    text = re.sub(r"^\.version \d+\.\d+$", f".version {PTX_ISA[0]}.{PTX_ISA[1]}", text, flags=re.M)
    if n != 1:
        raise ValueError(f"{source}: expected one .target line")
    if f".entry {function}(" not in text:
        raise ValueError(f"{source}: no .entry {function}")
    return text


def hand_record(launch) -> dict:
    """The manifest record of a hand-written kernel: its parameters are the launch's, no hidden
    scratch pointers, threads = num_warps · 32 (release: one thread)."""
    return {"file": f"{launch.function}.ptx", "entry": launch.function, "module": "",
            "function": launch.function,
            "params": [{"name": n, "type": a.signature, "hidden": False} for n, a in launch.args],
            "threads": 1 if launch.function == launches.RELEASE else launch.num_warps * 32,
            "shared": 0, "num_warps": launch.num_warps, "num_stages": 1,
            "global_scratch": {"size": 0, "align": 1}, "profile_scratch": {"size": 0, "align": 1},
            "constexprs": {}, "divisible_by_16": [], "pdl": False}


def write_ptx(path: Path, text: str) -> str:
    """Write one PTX file; returns the sha256 of its bytes (the manifest's digest)."""
    data = text.encode("ascii")
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def build(out: Path, profile_names, target_names, jobs: int) -> list[Path]:
    work = []
    for pname in profile_names:
        kernels = launches.kernels(profiles.get(pname))
        for target in target_names:
            for launch in kernels.values():
                if launch.function not in launches.HAND_WRITTEN:
                    work.append((pname, target, launch))
    results = {}
    with cf.ProcessPoolExecutor(max_workers=jobs, initializer=worker_init) as pool:
        futures = {pool.submit(compile_entry, (t, l)): (p, t) for p, t, l in work}
        for fut in cf.as_completed(futures):
            p, t = futures[fut]
            entry, ptx, record = fut.result()
            results[(p, t, entry)] = (ptx, record)
    written = []
    for pname in profile_names:
        for target in target_names:
            d = out / pname / target
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            manifest = {"profile": pname, "target": target, "triton": TRITON_VERSION,
                        "ptx_isa": f"{PTX_ISA[0]}.{PTX_ISA[1]}", "fp_fusion": False, "kernels": {}}
            for launch in launches.kernels(profiles.get(pname)).values():
                if launch.function in launches.HAND_WRITTEN:
                    record = hand_record(launch)
                    text = hand_ptx(launch.function, target)
                    record["sha256"] = write_ptx(d / record["file"], text)
                    written.append(d / record["file"])
                    manifest["kernels"][launch.kernel] = record
            for (p, t, entry), (ptx, record) in sorted(results.items()):
                if (p, t) != (pname, target):
                    continue
                record["sha256"] = write_ptx(d / record["file"], ptx)
                written.append(d / record["file"])
                manifest["kernels"][entry] = record
            manifest["kernels"] = dict(sorted(manifest["kernels"].items()))
            (d / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n",
                                             encoding="ascii")
            written.append(d / "manifest.json")
    return written


def differences(built: Path, reference: Path, dirs) -> list[str]:
    """What differs between two trees in the <profile>/<target> directories `dirs`: a file only
    in one of them, or whose bytes differ (paths relative to the trees, sorted)."""
    out = []
    for pname, target in dirs:
        a, b = built / pname / target, reference / pname / target
        mine = {p.relative_to(built) for p in a.rglob("*") if p.is_file()}
        theirs = {p.relative_to(reference) for p in b.rglob("*") if p.is_file()}
        out += [f"{p}: only in the rebuild" for p in mine - theirs]
        out += [f"{p}: only in {reference}" for p in theirs - mine]
        out += [f"{p}: differs ({(built / p).stat().st_size} B rebuilt, "
                f"{(reference / p).stat().st_size} B in {reference})"
                for p in mine & theirs if (built / p).read_bytes() != (reference / p).read_bytes()]
    return sorted(out)


def check(reference: Path, profile_names, target_names, jobs: int) -> list[str]:
    """Rebuild into a temporary directory; what differs from `reference` (empty: byte for byte)."""
    with tempfile.TemporaryDirectory(prefix="coppelius-ptx-check-") as tmp:
        build(Path(tmp), profile_names, target_names, jobs)
        return differences(Path(tmp), reference,
                           [(p, t) for p in profile_names for t in target_names])


def report(profile_name: str, target: str, as_json: bool = False, measured: Path | None = None) -> str:
    """The H200 cost model of the update list from the committed PTX (tools/cost/)."""
    from tools.cost.report import report as cost_report
    return cost_report(profile_name, target, "update", as_json, measured)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="where to build (with --check: the tree to compare with)")
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary directory and compare with --out byte for byte; "
                         "exit 1 naming every file that differs")
    ap.add_argument("--profile", action="append", choices=profiles.names())
    ap.add_argument("--target", action="append", choices=list(TARGETS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", action="store_true",
                    help="print the H200 cost model of the update list (ptxas -v on the committed PTX)")
    ap.add_argument("--json", action="store_true", help="with --report: the model as JSON")
    ap.add_argument("--measured", type=Path,
                    help="with --report: a device check's per-launch JSON [{label, kernel, us}] to "
                         "set beside the model")
    a = ap.parse_args(argv)
    if (a.json or a.measured) and not a.report:
        ap.error("--json and --measured go with --report")
    if a.check and a.report:
        ap.error("--check and --report are separate commands")
    if a.report:
        from coppelius.staging.errors import UserError
        try:
            for pname in a.profile or ["coppelius"]:
                for target in a.target or ["sm_90a"]:
                    print(report(pname, target, a.json, a.measured))
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        return 0
    names, targets, jobs = a.profile or profiles.names(), a.target or list(TARGETS), max(1, a.jobs)
    if a.check:
        differ = check(a.out, names, targets, jobs)
        for line in differ:
            print(line, file=sys.stderr)
        dirs = ", ".join(f"{p}/{t}" for p in names for t in targets)
        print(f"{a.out}: {len(differ)} file(s) differ from a rebuild ({dirs})" if differ else
              f"{a.out}: a rebuild reproduces {dirs} byte for byte")
        return 1 if differ else 0
    files = build(a.out, names, targets, jobs)
    total = sum(f.stat().st_size for f in files)
    print(f"{len(files)} files, {total / 1e6:.2f} MB under {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
