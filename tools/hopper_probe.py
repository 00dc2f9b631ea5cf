"""What the pinned Triton makes of TMA, warp specialization and thread-block clusters on sm_90a.

  .venv/bin/python -m tools.hopper_probe [--json]

The wide products' route below the L2 floor asks for TMA tensor descriptors, warp
specialization and operands shared across a thread-block cluster, as Triton offers them on
sm_90a.  This compiles one small persistent matmul (probe_matmul, below: a 128 × 128 tile, K in
blocks of 64, a fp32 epilogue that reads and writes its tile, as the weight gradients' AdamW does)
in the variants that route needs and reports, for each, whether Triton compiles it, its warps and
shared memory, what its PTX uses, and whether ptxas assembles it at the PTX ISA the project pins
(tools/build_ptx.PTX_ISA, CONTRACT §12); then the weight gradient with AdamW itself,
warp-specialized, at the PTX ISA its TMA needs: whether it partitions, its registers, spills and
CTAs per SM.
docs/PERFORMANCE.md ("TMA, warp specialization and clusters as the pinned Triton offers them")
reads the result; tests/tools/test_hopper_probe.py holds the facts that decision rests on, so a
Triton that changes one of them fails there.  No GPU is needed.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from coppelius.staging.errors import UserError

from tools.build_ptx import PTX_ISA, TARGETS, worker_init
from tools.cost.kernel_stats import KernelStats, occupancy, ptxas_path

BLOCK = (128, 128, 64)         # BLOCK_M, BLOCK_N, BLOCK_K of the probe
WARPS, STAGES = 4, 3           # the weight gradients' (plan/tuning.py: dw_warps, mm_stages)
TMA_ISA = (8, 6)               # the first PTX ISA whose cp.async.bulk.tensor takes .shared::cta


@dataclass(frozen=True)
class Variant:
    name: str
    descriptors: bool          # operands through tl.make_tensor_descriptor (TMA on sm_90a)
    warp_specialize: bool      # the tile loop as tl.range(..., warp_specialize=True)
    num_ctas: int = 1          # > 1: a thread-block cluster of that many CTAs per tile


VARIANTS = (
    Variant("pointer loads (today's kernels)", False, False),
    Variant("pointer loads, warp-specialized", False, True),
    Variant("tensor descriptors", True, False),
    Variant("tensor descriptors, warp-specialized", True, True),
    Variant("pointer loads, 2-CTA cluster", False, False, 2),
    Variant("tensor descriptors, 2-CTA cluster", True, False, 2),
)


@dataclass
class Result:
    variant: str
    compiled: bool
    error: str = ""            # the compiler's first diagnostic where it refused
    num_warps: int = 0
    shared: int = 0
    global_scratch: int = 0    # bytes per program the host supplies (device-side descriptors)
    tma_loads: int = 0         # cp.async.bulk.tensor instructions
    tma_dest: str = ""         # their destination state space (.shared::cta / .shared::cluster)
    multicast: int = 0         # .multicast::cluster operand copies
    cluster_smem: int = 0      # ld/st.shared::cluster (distributed shared memory) accesses
    setmaxnreg: tuple = ()     # the register counts the warp groups set
    wgmma: int = 0
    assembles_at_pin: bool = False
    ptxas_error: str = ""      # ptxas' first error at the pinned ISA
    needs_isa: str = ""        # the newest PTX ISA the features ptxas refused at the pin need


def probe_kernel():
    """The probe kernel, defined on the call: Triton is imported where it compiles (a worker) or
    interprets (a test), not where this module is."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DESC: tl.constexpr, WS: tl.constexpr):
        """c (M, N) fp32 = 0.5·c + aᵀ @ b, a (K, M) and b (K, N) bf16 (the weight gradients'
        operand layout), one persistent program per SM over the tiles."""
        tiles_n = tl.cdiv(N, BLOCK_N)
        tiles = tl.cdiv(M, BLOCK_M) * tiles_n
        if DESC:
            a_d = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[M, 1],
                                            block_shape=[BLOCK_K, BLOCK_M])
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                            block_shape=[BLOCK_K, BLOCK_N])
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), warp_specialize=WS):
            pid_m = tile // tiles_n
            pid_n = tile % tiles_n
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(0, K, BLOCK_K):
                if DESC:
                    a = a_d.load([k0, pid_m * BLOCK_M])
                    b = b_d.load([k0, pid_n * BLOCK_N])
                else:
                    offs_k = k0 + tl.arange(0, BLOCK_K)
                    a = tl.load(a_ptr + offs_k[:, None] * M + offs_m[None, :],
                                mask=(offs_k[:, None] < K) & (offs_m[None, :] < M), other=0.0)
                    b = tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :],
                                mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
                acc = tl.dot(tl.trans(a), b, acc)
            offs_c = offs_m[:, None] * N + offs_n[None, :]
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            c = tl.load(c_ptr + offs_c, mask=mask, other=0.0)
            tl.store(c_ptr + offs_c, 0.5 * c + acc, mask=mask)

    return probe_matmul


def weight_grad_kernel():
    """The weight gradient with AdamW (plan/kernels/weight_grad.py) with its operands through
    tensor descriptors and its tile loop warp-specialized: the same epilogue, the same tile order.
    A probe only: no launch list names it."""
    import triton
    import triton.language as tl

    from coppelius.plan.kernels.adamw import bias_corrections
    from coppelius.plan.kernels.grid_dependency import await_previous_grid
    from coppelius.plan.kernels.matmul import _tile_ids, col_pieces
    from coppelius.plan.kernels.weight_grad import PIECE, _adamw_epilogue

    @triton.jit
    def _product(a_d, b_d, pid_m, pid_n, T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, T, BLOCK_K):
            acc = tl.dot(tl.trans(a_d.load([k0, pid_m * BLOCK_M])), b_d.load([k0, pid_n * BLOCK_N]),
                         acc)
        return acc

    @triton.jit
    def weight_grad_ws(a0_ptr, b0_ptr, p0_ptr, h0_ptr, a1_ptr, b1_ptr, p1_ptr, h1_ptr, doorbell_ptr,
                       t_base, M0, N0, M1, N1, T, NPARAM, PRODUCTS: tl.constexpr,
                       LR: tl.constexpr, BETA1_F64: tl.constexpr, BETA2_F64: tl.constexpr,
                       DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                       BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
        await_previous_grid(PDL)
        a0_d = tl.make_tensor_descriptor(a0_ptr, shape=[T, M0], strides=[M0, 1],
                                         block_shape=[BLOCK_K, BLOCK_M])
        b0_d = tl.make_tensor_descriptor(b0_ptr, shape=[T, N0], strides=[N0, 1],
                                         block_shape=[BLOCK_K, BLOCK_N])
        tiles0 = tl.cdiv(M0, BLOCK_M) * tl.cdiv(N0, BLOCK_N)
        if PRODUCTS == 2:
            a1_d = tl.make_tensor_descriptor(a1_ptr, shape=[T, M1], strides=[M1, 1],
                                             block_shape=[BLOCK_K, BLOCK_M])
            b1_d = tl.make_tensor_descriptor(b1_ptr, shape=[T, N1], strides=[N1, 1],
                                             block_shape=[BLOCK_K, BLOCK_N])
            tiles = tiles0 + tl.cdiv(M1, BLOCK_M) * tl.cdiv(N1, BLOCK_N)
        else:
            a1_d, b1_d = a0_d, b0_d
            tiles = tiles0
        step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
        for pid in tl.range(tl.program_id(0), tiles, tl.num_programs(0), warp_specialize=True):
            if PRODUCTS == 1 or pid < tiles0:
                pid_m, pid_n = _tile_ids(pid, M0, N0, BLOCK_M, BLOCK_N, GROUP_M)
                g = _product(a0_d, b0_d, pid_m, pid_n, T, BLOCK_M, BLOCK_N, BLOCK_K)
                p_ptr, h_ptr, M, N = p0_ptr, h0_ptr, M0, N0
            else:
                pid_m, pid_n = _tile_ids(pid - tiles0, M1, N1, BLOCK_M, BLOCK_N, GROUP_M)
                g = _product(a1_d, b1_d, pid_m, pid_n, T, BLOCK_M, BLOCK_N, BLOCK_K)
                p_ptr, h_ptr, M, N = p1_ptr, h1_ptr, M1, N1
            _adamw_epilogue(col_pieces(g, BLOCK_M, BLOCK_N, PIECE),
                            pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N, p_ptr, h_ptr,
                            M, N, NPARAM, step_size, bc2_sqrt, DECAY, BETA1, ONE_MINUS_BETA1, BETA2,
                            ONE_MINUS_BETA2, EPS, BLOCK_N // PIECE)

    return weight_grad_ws


@dataclass(frozen=True)
class WeightGradVariant:
    products: int              # the launch's PRODUCTS (1: the head's; 2: a layer half's)
    tile: tuple                # (BLOCK_M, BLOCK_N)

    @property
    def name(self) -> str:
        bm, bn = self.tile
        return f"weight gradient + AdamW, {self.products} product(s), {bm} × {bn}"


WEIGHT_GRAD_VARIANTS = (WeightGradVariant(1, (128, 128)), WeightGradVariant(2, (128, 128)),
                        WeightGradVariant(1, (256, 128)))


@dataclass
class WeightGradResult:
    variant: str
    compiled: bool
    error: str = ""
    partitioned: bool = False  # the compiler split the loop into producer and consumer warps
    num_warps: int = 0
    shared: int = 0
    registers: int = 0         # ptxas, at TMA_ISA: per thread at launch
    spill_bytes: int = 0       # ptxas: spill stores
    stack_bytes: int = 0       # ptxas: cumulative stack size
    setmaxnreg: tuple = ()
    per_sm: int = 0            # CTAs resident per SM (the cost model's occupancy) …
    limiter: str = ""          # … and what limits it


def probe_weight_grad(variant: WeightGradVariant) -> WeightGradResult:
    """Compile the warp-specialized weight gradient for sm_90a at TMA_ISA (the pin refuses its
    TMA: probe()) with the coppelius launch's constexprs, and read ptxas -v.  Runs in a worker."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from coppelius.plan import launches, profiles

    launch = next(x for x in launches.kernels(profiles.get("coppelius")).values()
                  if x.function == "weight_grad"
                  and dict(x.constexprs)["PRODUCTS"] == variant.products)
    fn = weight_grad_kernel()
    args = dict(launch.args)
    constexprs = dict(launch.constexprs, BLOCK_M=variant.tile[0], BLOCK_N=variant.tile[1], PDL=True)
    signature = {n: (args[n].signature if n in args else "constexpr") for n in fn.arg_names}
    divisible = [launch.args[i][0] for i in launches.specialization(launch.args)]   # as built
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages,
               "ptx_version": TMA_ISA[0] * 10 + TMA_ISA[1], "enable_fp_fusion": False}
    try:
        k = _quiet_compile(lambda: triton.compile(ASTSource(fn, signature, constexprs=constexprs,
                                                            attrs=attrs),
                                                  target=GPUTarget("cuda", TARGETS["sm_90a"], 32),
                                                  options=options))
    except Exception as e:
        return WeightGradResult(variant.name, False, error=str(e).splitlines()[0])
    ptx = k.asm["ptx"]
    r = _run_ptxas(ptx, "sm_90a", "-v")
    said = r.stdout + r.stderr

    def figure(pattern: str) -> int:
        m = re.search(pattern, said)
        return int(m.group(1)) if m else 0
    regs = figure(r"Used (\d+) registers")
    per_sm, limiter = occupancy(KernelStats(regs, k.metadata.shared, k.metadata.num_warps * 32))
    return WeightGradResult(variant.name, True, partitioned="setmaxnreg" in ptx, per_sm=per_sm,
                            limiter=limiter,
                            num_warps=k.metadata.num_warps, shared=k.metadata.shared,
                            registers=regs,
                            spill_bytes=figure(r"(\d+) bytes spill stores"),
                            stack_bytes=figure(r"(\d+) bytes cumulative stack size"),
                            setmaxnreg=_setmaxnreg(ptx))


SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32", "M": "i32", "N": "i32",
             "K": "i32",
             "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
             "DESC": "constexpr", "WS": "constexpr"}


def _ptxas() -> str:
    """The cost model's ptxas (tools/cost/kernel_stats.py), else the one Triton ships."""
    try:
        return ptxas_path()
    except UserError:
        import triton
        return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


SETMAXNREG = re.compile(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)")


def _setmaxnreg(ptx: str) -> tuple:
    """The register counts a warp-specialized kernel's warp groups set, ascending."""
    return tuple(sorted({int(n) for n in SETMAXNREG.findall(ptx)}))


NEEDS = re.compile(r"Feature '([^']+)' requires PTX ISA \.version (\d+)\.(\d+)")


def _run_ptxas(ptx: str, target: str, *flags: str) -> subprocess.CompletedProcess:
    """ptxas on a PTX text for `target`, its object thrown away."""
    with tempfile.TemporaryDirectory(prefix="coppelius-probe-") as d:
        src = Path(d) / "probe.ptx"
        src.write_text(ptx)
        return subprocess.run([_ptxas(), f"-arch={target}", *flags, str(src), "-o",
                               str(Path(d) / "probe.o")], capture_output=True, text=True)


def _assemble(ptx: str, target: str) -> tuple[str, str]:
    """(ptxas' first error, the newest PTX ISA any feature it refused needs); ("", "") where the
    PTX assembles."""
    r = _run_ptxas(ptx, target)
    if r.returncode == 0:
        return "", ""
    errors = [re.sub(r"^.*?error\s*:\s*", "", ln) for ln in r.stderr.splitlines() if "error" in ln]
    needs = [(int(a), int(b)) for _, a, b in NEEDS.findall(r.stderr)]
    return (errors or [r.stderr.strip() or "failed"])[0], ("%d.%d" % max(needs)) if needs else ""


def _quiet_compile(compile_fn):
    """compile_fn() with the compiler's C++ diagnostics (MLIR reproducers: pages of IR) kept off
    the terminal; on a refusal the exception names its first diagnostic line."""
    with tempfile.TemporaryFile(mode="w+") as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            return compile_fn()
        except Exception as e:
            os.dup2(saved, 2)
            err.seek(0)
            said = [ln for ln in err.read().splitlines() if "ERROR" in ln or "error:" in ln]
            raise RuntimeError(f"{said[0].strip() if said else ''} ({e})".strip()) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def probe(variant: Variant, target: str = "sm_90a") -> Result:
    """Compile the probe kernel as `variant` says, at the pinned PTX ISA.  Runs in a worker."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn, bk = BLOCK
    constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "DESC": variant.descriptors,
                  "WS": variant.warp_specialize}
    src = ASTSource(probe_kernel(), SIGNATURE, constexprs=constexprs)
    options = {"num_warps": WARPS, "num_stages": STAGES, "num_ctas": variant.num_ctas,
               "ptx_version": PTX_ISA[0] * 10 + PTX_ISA[1], "enable_fp_fusion": False}
    try:
        gpu = GPUTarget("cuda", TARGETS[target], 32)
        k = _quiet_compile(lambda: triton.compile(src, target=gpu, options=options))
    except Exception as e:                                  # the compiler's refusal is the finding
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return Result(variant.name, False, error=lines[0] if lines else type(e).__name__)
    ptx = k.asm["ptx"]
    dest = re.findall(r"cp\.async\.bulk\.tensor\.\dd\.(shared::\w+)", ptx)
    ptxas_error, needs_isa = _assemble(ptx, target)
    return Result(variant.name, True, num_warps=k.metadata.num_warps, shared=k.metadata.shared,
                  global_scratch=k.metadata.global_scratch_size,
                  tma_loads=ptx.count("cp.async.bulk.tensor"),
                  tma_dest=",".join(sorted(set(dest))),
                  multicast=ptx.count(".multicast::cluster"),
                  cluster_smem=len(re.findall(r"\b(ld|st)\.shared::cluster", ptx)),
                  setmaxnreg=_setmaxnreg(ptx),
                  wgmma=ptx.count("wgmma.mma_async"),
                  assembles_at_pin=not ptxas_error, ptxas_error=ptxas_error, needs_isa=needs_isa)


def run(target: str = "sm_90a", jobs: int = 2) -> tuple[list[Result], list[WeightGradResult]]:
    """The probe kernel's variants on `target`; on sm_90a also the weight gradient's."""
    with cf.ProcessPoolExecutor(max_workers=jobs, initializer=worker_init) as pool:
        probes = pool.map(probe, VARIANTS, [target] * len(VARIANTS))
        grads = pool.map(probe_weight_grad, WEIGHT_GRAD_VARIANTS) if target == "sm_90a" else ()
        return list(probes), list(grads)


def weight_grad_table(results: list[WeightGradResult]) -> str:
    out = [f"The weight gradient with AdamW, warp-specialized over tensor descriptors, coppelius "
           f"launch constexprs, sm_90a at PTX ISA {TMA_ISA[0]}.{TMA_ISA[1]}:", "",
           "| variant | partitioned | warps | shared B | registers | spill B | stack B | "
           "setmaxnreg | CTAs per SM |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.compiled:
            out.append(f"| {r.variant} | no: {r.error} | | | | | | | |")
            continue
        regs = "/".join(map(str, r.setmaxnreg)) or "—"
        out.append(f"| {r.variant} | {'yes' if r.partitioned else 'no'} | {r.num_warps} | "
                   f"{r.shared:,} | {r.registers} | {r.spill_bytes} | {r.stack_bytes} | {regs} | "
                   f"{r.per_sm} ({r.limiter}) |")
    return "\n".join(out)


def table(results: list[Result], target: str) -> str:
    isa = f"{PTX_ISA[0]}.{PTX_ISA[1]}"
    bm, bn, bk = BLOCK
    out = [f"The probe matmul ({bm} × {bn} tile, K blocks of {bk}, {WARPS} warps, {STAGES} "
           f"stages) on {target}, PTX ISA {isa} (the pin):", "",
           "| variant | compiles | warps | shared B | scratch B | TMA loads (dest) | multicast | "
           "DSMEM accesses | setmaxnreg | wgmma | ptxas at the pin |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.compiled:
            out.append(f"| {r.variant} | no: {r.error} | | | | | | | | | |")
            continue
        tma = f"{r.tma_loads} ({r.tma_dest})" if r.tma_loads else "0"
        regs = "/".join(map(str, r.setmaxnreg)) or "—"
        ptxas = ("yes" if r.assembles_at_pin else
                 f"no: needs ISA {r.needs_isa}" if r.needs_isa else f"no: {r.ptxas_error}")
        out.append(f"| {r.variant} | yes | {r.num_warps} | {r.shared:,} | {r.global_scratch} | "
                   f"{tma} | {r.multicast} | {r.cluster_smem} | {regs} | {r.wgmma} | {ptxas} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=sorted(TARGETS), default="sm_90a")
    ap.add_argument("--json", action="store_true", help="the results as JSON")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    results, grads = run(args.target, args.jobs)
    if args.json:
        print(json.dumps({"probe": [asdict(r) for r in results],
                          "weight_grad": [asdict(r) for r in grads]}, indent=1))
    else:
        print(table(results, args.target))
        if grads:
            print()
            print(weight_grad_table(grads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
