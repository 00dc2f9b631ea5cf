"""What ptxas says each kernel needs (registers, spills: `ptxas -v` on the committed PTX) and how
many of its blocks fit an SM (the occupancy calculator's rules for cc 9.0, tools/cost/inputs.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from coppelius.staging.errors import UserError

from tools.cost.inputs import (BLOCKS_PER_SM, REG_ALLOC_UNIT, REGS_PER_SM, SMEM_ALLOC_UNIT, SMEM_PER_BLOCK,
                     SMEM_PER_SM, SMEM_RESERVED, SUBPARTITIONS, THREADS_PER_SM)
from tools.cost.work import cdiv

ROOT = Path(__file__).resolve().parents[2]
PTX_DIR = ROOT / "kernels_ptx"
REBUILD = "python -m tools.build_ptx"


@dataclass(frozen=True)
class KernelStats:
    regs: int
    shared: int                    # dynamic shared memory bytes (the manifest's "shared")
    threads: int
    spill: int = 0
    pdl: bool = False              # waits for its predecessor first (manifest "pdl": sm_90a)
    wgmma_serialized: bool = False  # ptxas serializes its wgmmas (C7515: serialized_wgmma)


def occupancy(stats: KernelStats) -> tuple[int, str]:
    """(programs resident per SM, the resource that limits it), as the occupancy calculator."""
    if stats.shared > SMEM_PER_BLOCK:
        raise ValueError(f"{stats.shared} B of shared memory exceed the {SMEM_PER_BLOCK} B per block")
    warps = cdiv(stats.threads, 32)
    regs_warp = cdiv(max(stats.regs, 1) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    warps_by_regs = (REGS_PER_SM // SUBPARTITIONS // regs_warp) * SUBPARTITIONS
    smem = cdiv(stats.shared, SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT + SMEM_RESERVED
    limits = {"registers": warps_by_regs // warps, "threads": THREADS_PER_SM // (warps * 32),
              "shared": SMEM_PER_SM // smem, "blocks": BLOCKS_PER_SM}
    limiter = min(limits, key=lambda k: limits[k])
    if limits[limiter] < 1:
        raise ValueError(f"a block of {stats.threads} threads × {stats.regs} registers does not fit an SM")
    return limits[limiter], limiter


SERIALIZED = "(C7515)"      # ptxas: "wgmma.mma_async instructions are serialized due to …"


def serialized_wgmma(stderr: str) -> bool:
    """Whether `ptxas -v` says it serialized the kernel's wgmmas (its performance warning C7515:
    each waits for the one before, a cost the model charges: WGMMA_SERIAL_CYCLES)."""
    return SERIALIZED in stderr


def ptxas_path() -> str:
    """The CUDA toolkit's ptxas: on PATH, else where the toolkit installs it."""
    for cand in (shutil.which("ptxas"), "/usr/local/bin/ptxas", "/usr/local/cuda/bin/ptxas"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise UserError("no ptxas on this machine: the cost model reads registers from `ptxas -v`",
                    "install the CUDA toolkit's ptxas or put it on PATH")


def ptxas_stats(profile_name: str, target: str) -> dict[str, KernelStats]:
    """`ptxas -v` on every committed PTX file of kernels_ptx/<profile>/<target>: entry → stats."""
    d = PTX_DIR / profile_name / target
    try:
        m = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise UserError(f"{d / 'manifest.json'} is missing", f"run {REBUILD}") from None
    ptxas = ptxas_path()
    out = {}
    for entry, rec in m["kernels"].items():
        r = subprocess.run([ptxas, f"-arch={target}", "-v", str(d / rec["file"]), "-o", os.devnull],
                           capture_output=True, text=True)
        regs = re.findall(r"Used (\d+) registers", r.stderr)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        if r.returncode != 0 or not regs:
            raise UserError(f"ptxas -v failed on {d / rec['file']}: {r.stderr.strip()[:200]}",
                            f"rebuild the PTX with {REBUILD}")
        out[entry] = KernelStats(int(regs[-1]), rec["shared"], rec["threads"],
                                 sum(int(x) + int(y) for x, y in spill), bool(rec.get("pdl")),
                                 serialized_wgmma(r.stderr))
    return out

