"""The launch lists' vocabulary: argument kinds, a launch, a submission, and a specialization's name.

A launch also says which lane of its submission's graph it runs on (`lane`: the main chain or the
side branch) and which launches of the other lane it waits for (`after`, by label): the
submission's dependency graph is data (plan/launches/graph.py derives and checks it), so no backend
guesses an order.
An argument is a buffer reference (buffer name + element offset, see plan/buffers.py), a staging
reference (a staging/layout.py offset, never a raw address), a scalar, or a run scalar the
backend fills at instantiation (`t_base`).  A launch's `kernel` names its manifest entry
(kernels_ptx/<profile>/<target>/manifest.json): a digest of everything the compiler specializes
on, so two launches share a compiled kernel exactly when they share an entry name.
Plain data: no Triton, no torch.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from coppelius.plan.buffers import DTYPE_BYTES

POINTER_ALIGN = 16          # bytes: pointer arguments specialized as 16-byte aligned when they are
INT_DIVISOR = 16            # integer arguments specialized as multiples of 16 when they are
RELEASE = "release"         # the hand-written PTX kernel (plan/kernels/release.ptx)
STAGE_IN = "release_stage_in"   # a submission's first launch (plan/kernels/release_stage_in.ptx)
HAND_WRITTEN = (RELEASE, STAGE_IN)      # written in PTX by hand: no Triton source, emulated by
#                                         the interpret backend and the fake driver
MAIN_LANE, SIDE_LANE = 0, 1     # a submission's graph: the critical chain and one side branch
LANES = (MAIN_LANE, SIDE_LANE)


# ---------------------------------------------------------------- argument kinds

@dataclass(frozen=True)
class BufferRef:
    buffer: str
    offset: int = 0             # elements
    dtype: str = "fp32"         # the buffer's element type

    @property
    def signature(self) -> str:
        return "*" + self.dtype

    @property
    def byte_offset(self) -> int:
        return self.offset * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class StagingRef:
    field: str                  # the staging/layout.py name, for people: "LOSS_RECORD", "loss_window(0)"
    offset: int                 # bytes from the staging base
    dtype: str = "fp32"

    @property
    def signature(self) -> str:
        return "*" + self.dtype


@dataclass(frozen=True)
class Scalar:
    type: str                   # "i32" | "i64" | "fp32"
    value: int | float

    @property
    def signature(self) -> str:
        return self.type


@dataclass(frozen=True)
class RunScalar:
    name: str                   # "t_base"
    type: str = "i64"

    @property
    def signature(self) -> str:
        return self.type


Arg = BufferRef | StagingRef | Scalar | RunScalar


def i32(value: int) -> Scalar:
    return Scalar("i32", int(value))


# ---------------------------------------------------------------- launches

@dataclass(frozen=True)
class Launch:
    kernel: str                                  # manifest entry name
    module: str                                  # "coppelius.plan.kernels.matmul" ("" for release)
    function: str                                # Triton function name, or "release"
    grid: tuple[int, int, int]
    args: tuple[tuple[str, Arg], ...]            # (parameter name, value) in parameter order
    constexprs: tuple[tuple[str, object], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    label: str = ""                              # the model stage, e.g. "layers.0.qkv"
    lane: int = MAIN_LANE                        # the graph branch it is captured on
    after: tuple[str, ...] = ()                  # labels of other-lane launches it waits for

    def arg(self, name: str) -> Arg:
        for n, a in self.args:
            if n == name:
                return a
        raise KeyError(f"{self.kernel} has no argument {name!r}")


@dataclass(frozen=True)
class Submission:
    index: int
    name: str
    launches: tuple[Launch, ...]
    # the predecessors of each launch (indices into `launches`, all earlier: the list order is a
    # valid topological order): the previous launch of its lane, then its `after` launches
    # (plan/launches/graph.py builds and checks them; the backends run exactly this graph)
    deps: tuple[tuple[int, ...], ...] = ()


def specialization(args) -> tuple[int, ...]:
    """Indices of the arguments compiled as 16-divisible (pointers: byte address; ints: value).

    Buffer bases are 256-byte aligned and the staging base page-aligned, so a pointer's
    alignment is its offset's."""
    out = []
    for i, (_, a) in enumerate(args):
        if isinstance(a, BufferRef) and a.byte_offset % POINTER_ALIGN == 0:
            out.append(i)
        elif isinstance(a, StagingRef) and a.offset % POINTER_ALIGN == 0:
            out.append(i)
        elif isinstance(a, Scalar) and a.type in ("i32", "i64") and a.value % INT_DIVISOR == 0:
            out.append(i)
    return tuple(out)


def entry_name(function: str, args, constexprs, num_warps: int, num_stages: int) -> str:
    """A stable manifest key per compiled specialization: function + digest of what shapes it."""
    key = repr((function, tuple((n, a.signature) for n, a in args), specialization(args),
                tuple(constexprs), num_warps, num_stages))
    return f"{function}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def triton_launch(module: str, function: str, grid, args: dict, constexprs: dict | None = None, *,
                  num_warps: int, num_stages: int, label: str) -> Launch:
    """A launch of a Triton kernel: grid padded to 3-D, its entry name derived from what it compiles."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    a = tuple(args.items())
    c = tuple((constexprs or {}).items())
    return Launch(entry_name(function, a, c, num_warps, num_stages), module, function, grid, a, c,
                  num_warps, num_stages, label)
