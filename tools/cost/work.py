"""The cost model's vocabulary (tools/cost/): what one program of a launch does — its loop
trips, one trip's and the prologue/epilogue's work (MMA FLOPs, bytes loaded and stored, MUFU and
ALU operations, dependent waits and memory round trips) —, the launch's unique HBM bytes and its
staging traffic per argument, and the registry the kernel families fill (kernels.py gathers
them: kernels_matmul.py, kernels_attention.py, kernels_rows.py).
Counting rules: a trip's bytes are what one program loads and stores in it (L2 traffic); a tile
loaded by many programs counts once per program; masked-out lanes move nothing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from coppelius.plan.buffers import DTYPE_BYTES
from coppelius.plan.ints import cdiv

from tools.cost.inputs import LINE


@dataclass(frozen=True)
class Step:
    """The work of one loop trip of one program (or of its prologue + epilogue)."""
    mma_flops: float = 0.0
    load_bytes: float = 0.0        # global loads (L2, and HBM on a miss)
    store_bytes: float = 0.0
    mufu_ops: float = 0.0          # exp, log, rcp, sqrt (div_rn is one rcp + ~10 ALU ops)
    alu_ops: float = 0.0           # other elementwise ops, over the whole program
    phases: int = 0                # dependent waits (PHASE each)
    serial_ops: int = 0            # dependent arithmetic on the chain (DEP_OP_CYCLES each)
    l2_trips: float = 0            # dependent loads that hit L2 (L2_LATENCY each)
    hbm_trips: float = 0           # dependent loads that miss (HBM_LATENCY each)
    staging_trips: int = 0         # dependent reads of mapped host memory (PCIE_LATENCY each)
    mma_sync: bool = False         # its MMAs are mma.sync, not wgmma (MMA_SYNC_RATE of the rate)
    serial_wgmma: int = 0          # wgmmas ptxas serialized (WGMMA_SERIAL_CYCLES each)


NOTHING = Step()


@dataclass(frozen=True)
class Programs:
    """Consecutive programs (blockIdx order) that share a trip and a prologue/epilogue."""
    trips: tuple[int, ...]         # loop trips of each program
    step: Step
    fixed: Step = NOTHING


@dataclass(frozen=True)
class Staging:
    """One staging (mapped host memory) argument's traffic in a launch, over all programs."""
    arg: str
    read_bytes: float = 0.0
    read_requests: int = 0         # LINE-sized (or smaller) read requests
    unique_bytes: float = 0.0      # distinct bytes read (what crosses PCIe if it is cached)
    write_bytes: float = 0.0


@dataclass(frozen=True)
class Work:
    programs: tuple[Programs, ...]
    hbm_bytes: float               # unique bytes read + written in device memory
    staging: tuple[Staging, ...] = ()
    extra_l2_bytes: float = 0.0    # traffic of a few programs kept out of their chain (h16 stores)
    fresh_bytes: float = 0.0       # of hbm_bytes, read just after a predecessor wrote them
    #                                (fresh.py): L2_RESIDENT of them are L2 hits (bounds.hbm_bytes)


def lines(nbytes: float) -> int:
    return cdiv(int(nbytes), LINE)


class View:
    """A Launch's arguments by name: scalars, constexprs, element sizes, staging arguments; and
    what the round-trip pass read off its kernel's PTX (`chain`: tools/cost/ptx_chain.py)."""

    def __init__(self, launch, bufs, chain=None):
        self.launch, self.bufs = launch, bufs
        self.args = dict(launch.args)
        self.c = dict(launch.constexprs)
        self._chain = chain

    @property
    def chain(self):
        if self._chain is None:
            raise KeyError(f"{self.launch.label}: no PTX round-trip figures for {self.launch.kernel} "
                           "(rebuild the PTX: python -m tools.build_ptx)")
        return self._chain

    @property
    def tile_trips(self) -> int:
        """Dependent round trips of one tile's straight-line code, from the PTX: the K loop's
        fill and the epilogue (the whole program where there is no loop)."""
        return self.chain.tile

    @property
    def trip_trips(self) -> float:
        """Dependent round trips each trip of the program's inner loop adds, from the PTX: 0 for
        a pipelined loop (it waits only for copies issued trips earlier), else its steady state."""
        return self.chain.per_trip

    @property
    def tail_bars(self) -> int:
        """CTA-wide barriers of one tile's epilogue (the whole program where there is no loop),
        from the PTX: each a dependent wait (PHASE)."""
        return self.chain.ops.bars

    def tail_ops(self) -> tuple[float, float]:
        """(ALU, MUFU) lane-operations of one tile's epilogue (the whole program where there is
        no loop): the PTX's issue slots per thread (ptx_ops.py) × the block's threads."""
        threads = self.launch.num_warps * 32
        return self.chain.ops.alu * threads, self.chain.ops.mufu * threads

    def scalar(self, name: str) -> int:
        return int(self.args[name].value)

    def elem(self, name: str) -> int:
        return DTYPE_BYTES[self.args[name].dtype]

    @property
    def programs(self) -> int:
        return self.launch.grid[0] * self.launch.grid[1] * self.launch.grid[2]

    def staging_args(self) -> set[str]:
        return {n for n, a in self.launch.args if hasattr(a, "field") and not hasattr(a, "buffer")}


def uniform(count: int, trips: int, step: Step, fixed: Step = NOTHING) -> Programs:
    return Programs((trips,) * count, step, fixed)


# ---------------------------------------------------------------- the registry
REGISTRY: dict[str, Callable[[View], Work]] = {}


def family(*functions: str):
    def register(fn):
        for f in functions:
            REGISTRY[f] = fn
        return fn
    return register


# -- AdamW's work per element and the doorbell every updating launch reads

PMV_BYTES = 3 * 4                # P, M, V fp32 of one parameter element
ADAMW_ALU, ADAMW_MUFU = 47, 3   # per element, where no PTX count is used (embed_decay/grad's
#                                 loops): ~20 fp32 ops + two div_rn (9 issue slots + a MUFU each,
#                                 inputs.DIV_RN_F32) and a sqrt_rn (SQRT_RN_F32)
BIAS_CORRECTION_OPS = 120        # t → two float64 powers by 40 squarings, a division, a sqrt


def doorbell_read(v: View, readers: int) -> tuple[Step, tuple]:
    """The doorbell read at the start of `readers` programs: a dependent read on each chain (of
    staging, or of the device copy in L2), then the bias corrections."""
    if "doorbell_ptr" in v.staging_args():
        return (Step(serial_ops=BIAS_CORRECTION_OPS, staging_trips=1),
                (Staging("doorbell_ptr", read_bytes=4 * readers, read_requests=readers,
                         unique_bytes=4),))
    return Step(serial_ops=BIAS_CORRECTION_OPS, l2_trips=1), ()


def add_steps(a: Step, b: Step) -> Step:
    return Step(*(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b))))


def scale_step(a: Step, k: int) -> Step:
    return Step(*(x * k for x in dataclasses.astuple(a)))
