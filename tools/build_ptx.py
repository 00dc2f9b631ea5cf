"""Build kernels_ptx/<profile>/<target>/ (SPEC §12): Triton ahead-of-time → PTX for every kernel
the launch lists name, the hand-written release PTX, and a manifest.json per directory.

  .venv/bin/python tools/build_ptx.py [--out DIR] [--profile P ...] [--target T ...] [--jobs N]

No GPU is needed.  Pinned: Triton 3.9.0, PTX ISA 8.0 (`.version 8.0`, what CUDA 12.0 drivers and
later accept; sm_90a's wgmma needs exactly 8.0), no line info, no FMA contraction (the interpreter
and the reference have none either).  Same sources → same bytes: the PTX carries no paths, dates
or debug info, and each worker compiles into a fresh Triton cache.

manifest.json: {"profile", "target", "triton", "ptx_isa", "fp_fusion", "kernels": {entry: {
"file", "sha256" (of the PTX file's bytes, checked by host/ptx.py at load), "entry" (the PTX
.entry symbol), "module", "function", "params": [{"name", "type", "hidden"}], "threads",
"shared" (dynamic shared memory bytes), "num_warps", "num_stages", "global_scratch": {"size",
"align"}, "profile_scratch": {"size", "align"}, "constexprs", "divisible_by_16": [parameter
names]}}}.  Triton appends two hidden pointer parameters
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

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from plan import launches, profiles  # noqa: E402  (plain data: no Triton in this process)

TRITON_VERSION = "3.9.0"
PTX_ISA = (8, 0)
TARGETS = {"sm_90a": 90, "sm_80": 80}
HIDDEN_PARAMS = ("global_scratch", "profile_scratch")
RELEASE_SOURCE = ROOT / "plan" / "kernels" / "release.ptx"
DEFAULT_OUT = ROOT / "kernels_ptx"


def _no_cubin(*args):
    """Triton stage hook: stop at PTX (the host loads PTX only; tests/test_ptx.py runs ptxas)."""
    if not args:
        return "coppelius-ptx-only", "0"
    stages = args[1]
    stages["cubin"] = lambda src, metadata: b""


def _worker_init():
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
    given = [n for n, _ in launch.args] + [n for n, _ in launch.constexprs]
    if sorted(given) != sorted(names):
        raise ValueError(f"{launch.kernel}: launch names {given}, kernel takes {names}")
    args = dict(launch.args)
    if [n for n in names if n in args] != [n for n, _ in launch.args]:
        raise ValueError(f"{launch.kernel}: launch arguments out of the kernel's parameter order")
    signature = {n: (args[n].signature if n in args else "constexpr") for n in names}
    divisible = [launch.args[i][0] for i in launches.specialization(launch.args)]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn, signature, constexprs=dict(launch.constexprs), attrs=attrs)
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
    }
    return launch.kernel, ptx, record


def release_ptx(target: str) -> str:
    text = RELEASE_SOURCE.read_text(encoding="ascii")
    text, n = re.subn(r"^\.target \w+$", f".target {target}", text, flags=re.M)
    text = re.sub(r"^\.version \d+\.\d+$", f".version {PTX_ISA[0]}.{PTX_ISA[1]}", text, flags=re.M)
    if n != 1:
        raise ValueError(f"{RELEASE_SOURCE}: expected one .target line")
    return text


def release_record() -> dict:
    return {"file": "release.ptx", "entry": "release", "module": "", "function": "release",
            "params": [{"name": "doorbell_ptr", "type": "*u32", "hidden": False},
                       {"name": "slot_ptr", "type": "*u32", "hidden": False}],
            "threads": 1, "shared": 0, "num_warps": 1, "num_stages": 1,
            "global_scratch": {"size": 0, "align": 1}, "profile_scratch": {"size": 0, "align": 1},
            "constexprs": {}, "divisible_by_16": []}


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
                if launch.function != launches.RELEASE:
                    work.append((pname, target, launch))
    results = {}
    with cf.ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) as pool:
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
            release = release_record()
            release["sha256"] = write_ptx(d / release["file"], release_ptx(target))
            written.append(d / release["file"])
            manifest = {"profile": pname, "target": target, "triton": TRITON_VERSION,
                        "ptx_isa": f"{PTX_ISA[0]}.{PTX_ISA[1]}", "fp_fusion": False,
                        "kernels": {launches.RELEASE: release}}
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


# H200 model for --report: what a roofline estimate assumes (SXM, 132 SMs)
H200_BF16_FLOPS = 989e12 * 0.55      # dense bf16 peak × what Triton wgmma kernels reach at these sizes
H200_FP32_FLOPS = 67e12 * 0.5
H200_BYTES_PER_S = 4.8e12 * 0.8      # HBM3e peak × achievable streaming fraction
H200_LAUNCH_S = 2.5e-6               # per kernel inside a CUDA graph: launch gap + ramp/tail


def _work(launch, bufs) -> tuple[float, float, str]:
    """(tensor-core FLOPs, bytes moved, kind) of one launch, from its arguments."""
    a = dict(launch.args)
    c = dict(launch.constexprs)
    f = launch.function
    nbytes = lambda name: bufs[a[name].buffer].nbytes if hasattr(a[name], "buffer") else 0  # noqa
    if f.startswith("matmul"):
        M, N, K = a["M"].value, a["N"].value, a["K"].value
        n_b = 2 if f == "matmul_swiglu" else 1
        flops = 2 * M * N * K * n_b
        # bytes per output element: stores and epilogue reads (rotary: bf16 out + the rope rows;
        # delta: fp32 dO out, fp32 o in, one delta word per head row)
        per = {"matmul_swiglu": 4 * 2 + 2, "matmul_rotary": 2, "matmul_delta": 4 + 4}.get(f) or \
            {0: 4, 1: 2, 2: 8, 3: 4 + 8}[c.get("EPILOGUE", 0)]
        extra = M * c["HEAD_DIM"] * 4 if f == "matmul_rotary" else \
            M * N // c["HEAD_DIM"] * 4 if f == "matmul_delta" else 0
        # rmsnorm in the prologue: A is the fp32 residual, read twice (row sums, then the operand),
        # and h16 (bf16) + rstd are stored once
        a_bytes = M * K * (4 + 4 + 2) + M * 4 if f in ("matmul_rotary", "matmul_swiglu", "matmul_norm") \
            else 2 * M * K
        return flops, a_bytes + 2 * n_b * N * K + M * N * per + extra, "mma"
    if f.startswith("attention"):
        T, H, d = a["T"].value, c["HEADS"], c["HEAD_DIM"]
        causal = T * T / 2 * H * d * 2
        mult = {"attention_fwd": 2, "attention_bwd": 4 + 3}[f]    # backward: dK/dV 4, dQ 3
        return causal * mult, T * (H + 2 * c["KV_HEADS"]) * d * 2 * 4, "mma"
    if f == "adamw":
        n = a["N"].value
        no_w16 = (c["EMBED_END"] - c["EMBED_START"] + c["GAIN0_END"] - c["GAIN0_START"]
                  + c["GAIN1_END"] - c["GAIN1_START"])
        return 0, n * (4 * 4 + 3 * 4) + (n - no_w16) * 2, "stream"
    if f in ("cast_bf16", "copy_f32"):
        n = a["N"].value
        return 0, n * (6 if f == "cast_bf16" else 8), "stream"
    if f == "embed_grad":
        # de read, dE written, and the first W1_WORDS words again into the w1 window
        return 0, bufs["de"].nbytes + a["V"].value * c["D"] * 4 + c["W1_WORDS"] * 4, "stream"
    if f == "cross_entropy":
        return 0, a["T"].value * c["V"] * 6, "stream"
    # row kernels: read and write (T, D)-sized operands
    def size(v):
        return bufs[v.buffer].nbytes // max(1, bufs[v.buffer].shape[0]) \
            if len(bufs[v.buffer].shape) == 3 else bufs[v.buffer].nbytes

    touched = sum(size(v) for v in a.values()
                  if hasattr(v, "buffer") and v.buffer not in ("pmv", "grad", "w16"))
    if f == "rmsnorm_bwd_gain":     # the gain-gradient programs read dy, x and r a second time
        touched += sum(size(a[n]) for n in ("dy_ptr", "x_ptr", "rstd_ptr"))
    return 0, touched, "stream"


def report(profile_name: str, target: str) -> str:
    """ptxas -v per manifest entry and an H200 roofline estimate per launch of the update list."""
    import subprocess
    d = DEFAULT_OUT / profile_name / target
    m = json.loads((d / "manifest.json").read_text())
    ptxas = shutil.which("ptxas") or "/usr/local/bin/ptxas"
    stats = {}
    for entry, rec in m["kernels"].items():
        r = subprocess.run([ptxas, f"-arch={target}", "-v", str(d / rec["file"]), "-o", os.devnull],
                           capture_output=True, text=True)
        regs = re.findall(r"Used (\d+) registers", r.stderr)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        stats[entry] = (int(regs[-1]) if regs else 0, rec["shared"],
                        sum(int(x) + int(y) for x, y in spill))
    prof = profiles.get(profile_name)
    from plan.buffers import buffers
    bufs = buffers(prof)
    rows, total = {}, 0.0
    for launch in launches.submissions(prof)[1].launches:
        if launch.function == launches.RELEASE:
            t, flops, nbytes = H200_LAUNCH_S, 0, 16
        else:
            flops, nbytes, kind = _work(launch, bufs)
            t = max(flops / H200_BF16_FLOPS, nbytes / H200_BYTES_PER_S) + H200_LAUNCH_S
        key = launch.function if launch.function != "matmul" else \
            f"matmul {launch.label.split('.', 2)[-1] if launch.label.startswith('layers') else launch.label}"
        r = rows.setdefault(key, [0, 0.0, 0.0, 0.0, launch.kernel])
        r[0] += 1
        r[1] += flops
        r[2] += nbytes
        r[3] += t
        total += t
    out = [f"| launch (update, {profile_name}) | n | regs | smem B | spill B | GFLOP | MB | predicted µs |",
           "|---|---|---|---|---|---|---|---|"]
    for key, (n, flops, nbytes, t, entry) in sorted(rows.items(), key=lambda kv: -kv[1][3]):
        regs, smem, spill = stats[entry]
        out.append(f"| {key} | {n} | {regs} | {smem} | {spill} | {flops / 1e9:.1f} | "
                   f"{nbytes / 1e6:.1f} | {t * 1e6:.0f} |")
    out.append(f"| **total** | {sum(r[0] for r in rows.values())} | | | | "
               f"{sum(r[1] for r in rows.values()) / 1e9:.1f} | {sum(r[2] for r in rows.values()) / 1e6:.0f} | "
               f"**{total * 1e6:.0f}** |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--profile", action="append", choices=profiles.names())
    ap.add_argument("--target", action="append", choices=list(TARGETS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", action="store_true",
                    help="print ptxas -v figures and the H200 estimate of the committed PTX")
    a = ap.parse_args(argv)
    if a.report:
        for pname in a.profile or ["coppelius"]:
            for target in a.target or ["sm_90a"]:
                print(report(pname, target))
        return 0
    files = build(a.out, a.profile or profiles.names(), a.target or list(TARGETS), max(1, a.jobs))
    total = sum(f.stat().st_size for f in files)
    print(f"{len(files)} files, {total / 1e6:.2f} MB under {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
