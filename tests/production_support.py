"""Issue #12 item 6: run production launches in Triton's interpreter, a chosen sample of programs each.

One `Case` per launch (a `plan.launches.Launch`, unchanged: its function, constexprs, grid and
arguments).  Every buffer the launch names is a full-size, lazily allocated anonymous mapping
(plan/buffers.py sizes, a 64 KiB guard either side), so each BufferRef offset is honoured as on the
GPU (the pointer is base + offset) while only the pages a case touches cost memory; staging is one
8 MiB region poisoned with staging.layout.POISON_BYTE.  A case runs in five steps:

  1. the registry entry's `setup` writes random inputs (`case.input`) and declares the outputs
     (`case.output`, with the tolerance of each) in the logical shapes the kernel addresses;
  2. `programs` picks the program ids to run (the first, the last, a few between, and the ones that
     reach masks and boundaries);
  3. `expect(case, pid)` yields, for one program, each output region it owns (derived from the
     kernel's program → tile mapping, written once below: `matmul_tile`, `attention_split_of`,
     `rmsnorm_bwd_gain_program`) with the numpy oracle's values there;
  4. watched memory is poisoned (device buffers 0xFF, NaN / -1; staging 0xA5) except the inputs,
     whose bytes are kept: a whole buffer when it is ≤ 64 MiB (staging always), else each input
     and output region (or, for outputs over 64 MiB — AdamW's planes, the w16 cast — each owned
     run) with GUARD_ELEMENTS either side.  A write far outside those windows of a large buffer
     (pmv, grad, w16, ab) is not seen; the owned region staying poison still is;
  5. `run_programs` executes only the chosen programs; then every owned element must hold the
     oracle's value within its tolerance and be written (not poison: an output that is also an
     input, e.g. ACCUMULATE, is judged by its value), and every other watched byte must hold what
     it held before (no stray writes).  Failures name the element and where it is.

Adding a kernel family (a split-K matmul, AdamW fused in a dW epilogue, a split attention):

    @oracle("my_function")          # the Triton function name, Launch.function
    class _MyFunction:
        def setup(self, case): ...  # case.scalar("M"), case.const("BLOCK_M"), case.input(...), case.output(...)
        def programs(self, case): return sample(case.launch.grid[0], <pids that hit edges>)
        def expect(self, case, pid): yield "c_ptr", (rows, cols), want   # ints / unit-step slices

`case.input(name, shape | values=, at=)` writes at the argument's offset (+ `at` elements) and
returns what the kernel reads (bf16-rounded for bf16 buffers), kept in `case.data`; `case.cache`
holds oracle intermediates; `case.hint` carries programs chosen in setup when the inputs depend on
them (cast, AdamW: only the sampled chunks of the 57.7 M-element planes are written);
`case.watch(name, index)` poisons elements a program must skip without owning them;
`case.run_scalars["t_base"]` gives RunScalar values.  An entry that cannot run in the interpreter
goes to SKIPPED with its reason.  A production launch whose function is in neither fails
test_production_launches.py.  Program → tile mappings get a small-shape test there (each program
run alone writes exactly what the mapping says).
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import mmap
import time
import types
import zlib
from dataclasses import dataclass

import host.backend_interpret as backend_interpret
import numpy as np
import torch
from kernels_support import ELEMENTWISE, ONE_BF16_ULP, SAME_OPERANDS
from test_kernels_adamw import ADAMW_REL
from test_kernels_attention import ATTENTION_GRAD, ATTENTION_GRAD16, ATTENTION_OUT
from triton import cdiv
from triton.runtime import interpreter as _interp

from host.backend import BUFFER_POISON  # device buffers: NaN for floats, -1 for ints
from plan import launches as L
from plan.attention_split import AttentionSplit
from plan import reference as ref
from plan.kernels import meta
from staging import layout as SL

STAGING_POISON = SL.POISON_BYTE
SPACE_GUARD_BYTES = 64 * 1024   # mapped, watched bytes before and after every buffer
GUARD_ELEMENTS = 4096           # watched elements either side of a region of a large buffer
WATCH_WHOLE_BYTES = 64 << 20    # buffers up to this size are poisoned and watched whole
NP_DTYPES = {"fp32": np.float32, "bf16": np.uint16, "i32": np.int32, "u32": np.uint32}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32,
                "u32": torch.int32}   # u32 words are viewed as int32, as the interpret backend does


@dataclass(frozen=True)
class Tol:
    """A named tolerance: |got − want| ≤ rel · max|want|, the max over every region of that output
    the sampled programs own, as the kernel tests take it over the expected array (0: bit-exact)."""
    name: str
    rel: float


EXACT = Tol("EXACT", 0.0)
T_SAME = Tol("SAME_OPERANDS", SAME_OPERANDS)
T_ULP = Tol("ONE_BF16_ULP", ONE_BF16_ULP)
T_ELEM = Tol("ELEMENTWISE", ELEMENTWISE)
T_ATT_OUT = Tol("ATTENTION_OUT", ATTENTION_OUT)
# o16 = bf(o): ATTENTION_OUT, then a bf16 rounding that may go the other way
T_ATT_OUT16 = Tol("ATTENTION_OUT16", ATTENTION_OUT + ONE_BF16_ULP)
T_ATT_GRAD16 = Tol("ATTENTION_GRAD16", ATTENTION_GRAD16)
T_ATT_GRAD = Tol("ATTENTION_GRAD", ATTENTION_GRAD)
T_ADAMW = Tol("ADAMW_REL", ADAMW_REL)
# lse against float64 log-sum-exp of the same bf16 scores (test_kernels_attention's 1e-5)
T_LSE = Tol("LSE", 1e-5)
# dg = Σ over 1024 rows in blocks of GAIN_ROWS vs numpy's pairwise sum (test_kernels_rows' 1e-5)
T_GAIN_SUM = Tol("GAIN_SUM", 1e-5)
# z = bf(silu(a)·b) with a, b one bf16 ulp apart at most (test_kernels_matmul's 2 ulp)
T_Z16 = Tol("SWIGLU_Z16", 2 * ONE_BF16_ULP)
# delta = Σ_d dO·o per head: dO to SAME_OPERANDS, 64-term sums in another order
T_DELTA = Tol("DELTA_SUM", 1e-5)


def bf16_bits(x) -> np.ndarray:
    """fp32 values → their bf16 bit patterns, round to nearest even (the reference's bf16)."""
    return (ref.bf16(np.asarray(x, np.float32)).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------- choosing programs

@contextlib.contextmanager
def _chosen_programs(grid, pids, ran):
    """Make the interpreter run `pids` (3-tuples) of `grid` when launched with grid (len(pids),).

    Triton 3.9.0's GridExecutor.__call__ calls the module-level `interpreter_builder.set_grid_dim`
    with the launch grid, then `set_grid_idx(x, y, z)` before each program, and program_id /
    num_programs read those.  Shadowing the two methods on the builder instance maps loop index x
    to pids[x] and reports the real grid, so the kernel sees exactly what the GPU would give that
    program.  `ran` records what executed; run_programs checks it, so a Triton that iterates the
    grid some other way fails loudly instead of running the wrong programs."""
    builder = _interp.interpreter_builder
    cls = type(builder)
    real_dim, real_idx = cls.set_grid_dim, cls.set_grid_idx

    def set_grid_dim(nx, ny, nz):
        if (nx, ny, nz) != (len(pids), 1, 1):
            raise RuntimeError(f"interpreter launched grid {(nx, ny, nz)}, expected ({len(pids)}, 1, 1)")
        real_dim(builder, *grid)

    def set_grid_idx(x, y, z):
        if (y, z) != (0, 0):
            raise RuntimeError(f"interpreter program ({x}, {y}, {z}) outside the sample grid")
        real_idx(builder, *pids[x])
        ran.append(pids[x])

    builder.set_grid_dim, builder.set_grid_idx = set_grid_dim, set_grid_idx
    try:
        yield
    finally:
        del builder.set_grid_dim, builder.set_grid_idx


def _pid3(pid) -> tuple[int, int, int]:
    t = (pid,) if isinstance(pid, (int, np.integer)) else tuple(pid)
    return tuple(int(v) for v in t) + (0,) * (3 - len(t))


def run_programs(fn, grid, pids, args, constexprs, num_warps: int = 4, num_stages: int = 3) -> None:
    """Run the programs `pids` (ints or tuples) of a launch of `fn` over `grid`, in that order.
    num_warps / num_stages go with the launch as on the GPU; the interpreter accepts and drops them
    (they shape the compiled code only: tests/test_ptx.py and the manifest cover that)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    chosen = [_pid3(p) for p in pids]
    for p in chosen:
        if not all(0 <= v < g for v, g in zip(p, grid)):
            raise ValueError(f"program {p} outside grid {grid}")
    ran: list = []
    # one BLAS thread: interpreter tiles are small (the backend's measurement); speed only
    blas = getattr(backend_interpret, "single_thread_blas", contextlib.nullcontext)
    with blas(), _chosen_programs(grid, chosen, ran):
        fn[(len(chosen),)](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
    if ran != chosen:
        raise RuntimeError(f"the interpreter ran programs {ran[:8]}, asked for {chosen[:8]}")


def sample(n: int, *extra: int) -> list[int]:
    """Program ids of a 1-D grid of n: the first, the last, a third and two thirds in, and `extra`."""
    bad = [e for e in extra if not 0 <= e < n]
    if bad:
        raise ValueError(f"programs {bad} outside a grid of {n}")
    return sorted({0, n - 1, n // 3, 2 * n // 3, *extra})


# ---------------------------------------------------------------- program → tile mappings

def matmul_tile(pid: int, M: int, N: int, BM: int, BN: int, GROUP_M: int) -> tuple[int, int]:
    """(pid_m, pid_n) of program pid: plan/kernels/matmul.py `_tile_ids`, grouped ordering."""
    tiles_m, tiles_n = cdiv(M, BM), cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    return first_m + pid % per_group % size_m, pid % per_group // size_m


def matmul_pid(pid_m: int, pid_n: int, M: int, N: int, BM: int, BN: int, GROUP_M: int) -> int:
    """The program that owns tile (pid_m, pid_n): the inverse of matmul_tile."""
    tiles_m, tiles_n = cdiv(M, BM), cdiv(N, BN)
    first_m = pid_m // GROUP_M * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    return first_m * tiles_n + pid_n * size_m + pid_m - first_m


def attention_split_of(case) -> AttentionSplit:
    """The attention launch's program → work mapping (plan/attention_split.py, which the kernels'
    id decode follows) from its T and constexprs."""
    c = dict(case.launch.constexprs)
    return AttentionSplit(case.scalar("T"), c["BLOCK_M"], c["BLOCK_N"], c["HEADS"],
                          c.get("KV_HEADS", c["HEADS"]), c.get("FWD_CHUNK", 1), c.get("BWD_CHUNK", 1))


def rmsnorm_bwd_gain_program(pid: int, T: int, BLOCK_R: int):
    """("rows", row block) for the first cdiv(T, BLOCK_R) programs, then ("gain", column block)."""
    row_programs = cdiv(T, BLOCK_R)
    return ("rows", pid) if pid < row_programs else ("gain", pid - row_programs)


def _block(i: int, size: int, limit: int) -> slice:
    return slice(i * size, min((i + 1) * size, limit))


# ---------------------------------------------------------------- memory

class Space:
    """One buffer (or the staging region) as a lazily allocated mapping with guards either side."""

    def __init__(self, name: str, nbytes: int, poison: int, spec=None):
        self.name, self.nbytes, self.poison, self.spec = name, nbytes, poison, spec
        self.base = SPACE_GUARD_BYTES
        self.total = SPACE_GUARD_BYTES + nbytes + SPACE_GUARD_BYTES
        self._map = mmap.mmap(-1, self.total)       # zero pages until touched
        self.bytes = np.frombuffer(self._map, np.uint8)
        self.inputs: list[tuple[int, int]] = []     # absolute byte intervals written by setup
        self.watch: list[tuple[int, int]] = []      # absolute byte intervals poisoned and compared
        self.saved: list[tuple[int, int, np.ndarray]] = []   # input bytes as setup left them

    def where(self, b: int) -> str:
        """A byte offset for people: the buffer element (and index in its shape) or the guard."""
        off = b - self.base
        if off < 0:
            return f"{self.name} front guard, {-off} bytes before the base"
        if off >= self.nbytes:
            return f"{self.name} back guard, {off - self.nbytes} bytes past the end"
        if self.spec is None:
            return f"{self.name} byte {off:#x}"
        item = L.DTYPE_BYTES[self.spec.dtype]
        return (f"{self.name} element {off // item} "
                f"{tuple(int(i) for i in np.unravel_index(off // item, self.spec.shape))}")


@dataclass
class Output:
    arg: str
    shape: tuple[int, ...]
    tol: Tol
    space: Space
    start: int                  # absolute byte offset of the logical region's first element
    dtype: str
    at: int = 0                 # elements past the argument's pointer (a P/M/V plane behind it)

    @property
    def itemsize(self) -> int:
        return L.DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def _runs(shape, index):
    """Flat element runs [start, stop) of `index` (ints and unit-step slices) in a C-order shape."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > len(shape):
        raise IndexError(f"index {index} has more axes than shape {shape}")
    index = index + (slice(None),) * (len(shape) - len(index))
    ranges = []
    for dim, ix in zip(shape, index):
        if isinstance(ix, slice):
            start, stop, step = ix.indices(dim)
            if step != 1:
                raise IndexError(f"index {index}: only unit-step slices")
        else:
            start, stop = int(ix), int(ix) + 1
            if not 0 <= start < dim:
                raise IndexError(f"index {index} outside shape {shape}")
        ranges.append((start, max(start, stop)))
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    lo, hi = ranges[-1]
    if hi == lo:
        return
    for lead in itertools.product(*(range(a, b) for a, b in ranges[:-1])):
        base = sum(i * s for i, s in zip(lead, strides))
        yield base + lo, base + hi


def _merge(intervals):
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [tuple(x) for x in out]


class Case:
    """One launch's inputs, outputs, sampled programs and checks (see the module docstring)."""

    def __init__(self, launch, specs, profile=None, seed: int | None = None):
        self.launch = launch
        self.specs = specs                          # buffer name → plan.buffers.BufferSpec
        self.profile = profile
        self.rng = np.random.default_rng(zlib.crc32(launch.kernel.encode()) if seed is None else seed)
        self.spaces: dict[str, Space] = {}
        self.outputs: dict[str, Output] = {}
        self.data: dict[str, np.ndarray] = {}       # what setup wrote, as the kernel reads it
        self.run_scalars: dict[str, int] = {}       # RunScalar values (t_base)
        self.cache: dict = {}                       # oracle intermediates shared by programs
        self.claims: list[tuple[str, object, np.ndarray, object]] = []   # (output, index, want, pid)
        self.extra_watch: list[tuple[str, object]] = []
        self.pids: list = []
        self.hint: list | None = None               # programs setup chose (inputs depend on them)

    # -- the launch
    def scalar(self, *names):
        vals = [self.launch.arg(n).value for n in names]
        return vals[0] if len(vals) == 1 else vals

    def const(self, *names):
        c = dict(self.launch.constexprs)
        vals = [c[n] for n in names]
        return vals[0] if len(vals) == 1 else vals

    def _space(self, arg) -> Space:
        if isinstance(arg, L.StagingRef):
            key, nbytes, poison, spec = "staging", SL.REGION_BYTES, STAGING_POISON, None
        elif isinstance(arg, L.BufferRef):
            spec = self.specs[arg.buffer]
            key, nbytes, poison = arg.buffer, spec.nbytes, BUFFER_POISON
        else:
            raise TypeError(f"{self.launch.kernel}: {arg} is not a pointer argument")
        if key not in self.spaces:
            s = Space(key, nbytes, poison, spec)
            if key == "staging":
                s.bytes[:] = STAGING_POISON          # a fresh staging region is poisoned whole
            self.spaces[key] = s
        return self.spaces[key]

    def _locate_arg(self, arg, at: int = 0):
        """(space, absolute byte offset, dtype) of element `at` of a pointer argument."""
        space = self._space(arg)
        start = space.base + (arg.offset if isinstance(arg, L.StagingRef) else arg.byte_offset)
        return space, start + at * L.DTYPE_BYTES[arg.dtype], arg.dtype

    def _locate(self, name: str, at: int = 0):
        return self._locate_arg(self.launch.arg(name), at)

    def region(self, name: str, shape, at: int = 0) -> np.ndarray:
        """The raw typed view (bf16 as uint16 bits) of `shape` elements at argument `name`."""
        space, start, dtype = self._locate(name, at)
        n = math.prod(shape) * L.DTYPE_BYTES[dtype]
        if start + n > space.total:
            raise ValueError(f"{self.launch.kernel}: {name} region {shape} runs past {space.name}")
        return space.bytes[start:start + n].view(NP_DTYPES[dtype]).reshape(shape)

    # -- setup
    def input(self, name: str, shape=None, scale: float = 1.0, values=None, at: int = 0,
              key: str | None = None) -> np.ndarray:
        """Write `values` (default: scale·N(0, 1), never zeros) at argument `name` (+ `at`
        elements); returns the values as the kernel reads them (bf16-rounded for bf16), also kept
        in case.data[key or name]."""
        if values is None:
            values = scale * self.rng.standard_normal(shape, dtype=np.float32)
        values = np.asarray(values)
        space, start, dtype = self._locate(name, at)
        view = self.region(name, values.shape, at)
        if dtype == "bf16":
            view[...] = bf16_bits(values)
            seen = bf16_values(view)
        else:
            view[...] = values.astype(NP_DTYPES[dtype])
            seen = view.copy()
        if dtype in ("fp32", "bf16"):
            seen = seen.astype(np.float32)
        space.inputs.append((start, start + view.nbytes))
        self.data[key or name] = seen
        return seen

    def output(self, name: str, shape, tol: Tol, at: int = 0, key: str | None = None) -> None:
        """Declare the output region `shape` at argument `name` (+ `at` elements), owned and
        checked as `key` (default: the argument's name; one pointer may lead to several
        outputs, e.g. the P, M and V planes of a parameter)."""
        space, start, dtype = self._locate(name, at)
        self.outputs[key or name] = Output(name, tuple(shape), tol, space, start, dtype, at)

    def watch(self, name: str, index) -> None:
        """Also poison and watch `index` of output `name` without owning it (elements a sampled
        program must skip, e.g. AdamW's w16 of the gains): for outputs watched run by run."""
        self.extra_watch.append((name, index))

    # -- running and checking
    def resolve(self, arg):
        if isinstance(arg, (L.BufferRef, L.StagingRef)):
            space, start, dtype = self._locate_arg(arg)
            item = L.DTYPE_BYTES[dtype]
            stop = start + (space.total - start) // item * item
            return torch.from_numpy(space.bytes[start:stop]).view(TORCH_DTYPES[dtype])
        if isinstance(arg, L.Scalar):
            return arg.value
        if isinstance(arg, L.RunScalar):
            if arg.name not in self.run_scalars:
                raise KeyError(f"{self.launch.kernel}: setup gave no value for run scalar {arg.name!r}")
            return self.run_scalars[arg.name]
        raise TypeError(f"{self.launch.kernel}: unknown argument kind {arg!r}")

    def prepare(self, entry) -> None:
        """Ownership and oracle values of every sampled program; poison and snapshot the watch."""
        for pid in self.pids:
            for name, index, want in entry.expect(self, pid):
                if name not in self.outputs:
                    raise KeyError(f"{self.launch.kernel}: program {pid} owns {name!r}, "
                                   f"which setup did not declare as an output")
                self.claims.append((name, index, np.asarray(want), pid))
        for _, a in self.launch.args:                # every pointer's buffer, inputs included
            if isinstance(a, (L.BufferRef, L.StagingRef)):
                self._space(a)
        for space in self.spaces.values():
            space.watch = self._plan_watch(space)
            self._poison_and_snapshot(space)

    def _byte_runs(self, out: Output, index):
        for s, e in _runs(out.shape, index):
            yield out.start + s * out.itemsize, out.start + e * out.itemsize

    def _plan_watch(self, space: Space) -> list[tuple[int, int]]:
        """Whole small buffers; else every input and output region (or owned run) ± a guard."""
        if space.total <= WATCH_WHOLE_BYTES:
            return [(0, space.total)]
        g = GUARD_ELEMENTS * 4
        w = [(lo - g, hi + g) for lo, hi in space.inputs]
        for out in self.outputs.values():
            if out.space is not space:
                continue
            g = GUARD_ELEMENTS * out.itemsize
            if out.nbytes <= WATCH_WHOLE_BYTES:
                w.append((out.start - g, out.start + out.nbytes + g))
                continue
            parts = [(n, ix) for n, ix, _, _ in self.claims] + self.extra_watch
            for name, index in parts:
                if name == out.arg:
                    w.extend((a - g, b + g) for a, b in self._byte_runs(out, index))
        return _merge((max(0, lo), min(space.total, hi)) for lo, hi in w)

    def _poison_and_snapshot(self, space: Space) -> None:
        """Poison each watched interval except the inputs; keep a copy of the inputs' bytes (the
        rest must still be poison after the run unless owned: no full snapshot is needed)."""
        inputs = _merge(space.inputs)
        for lo, hi in space.watch:
            start = lo                               # poison [lo, hi) around the inputs
            for a, b in inputs:
                if b <= lo or a >= hi:
                    continue
                if a > start:
                    space.bytes[start:a] = space.poison
                start = max(start, b)
            if start < hi:
                space.bytes[start:hi] = space.poison
        space.saved = [(a, b, space.bytes[a:b].copy()) for a, b in inputs]
        for name, index, _, _ in self.claims:
            out = self.outputs[name]
            if out.space is space:
                for a, b in self._byte_runs(out, index):
                    if not any(lo <= a and b <= hi for lo, hi in space.watch):
                        raise AssertionError(f"{name}: owned bytes [{a}, {b}) of {space.name} "
                                             f"are not inside one watched interval")

    @staticmethod
    def _input_mask(space: Space, a: int, b: int) -> np.ndarray:
        """(b − a,) bool: which bytes of [a, b) setup wrote as inputs."""
        mask = np.zeros(b - a, bool)
        for lo, hi in space.inputs:
            if lo < b and hi > a:
                mask[max(lo, a) - a:min(hi, b) - a] = True
        return mask

    def _stray(self, space: Space) -> list[str]:
        """Bytes of the watched intervals that changed and no sampled program owns."""
        owned = [r for name, index, _, _ in self.claims if self.outputs[name].space is space
                 for r in self._byte_runs(self.outputs[name], index)]
        out = []
        for lo, hi in space.watch:
            changed = space.bytes[lo:hi] != space.poison
            for a, b, saved in space.saved:
                a2, b2 = max(a, lo), min(b, hi)
                if a2 < b2:
                    changed[a2 - lo:b2 - lo] = space.bytes[a2:b2] != saved[a2 - a:b2 - a]
            for a, b in owned:
                if a < hi and b > lo:
                    changed[max(a, lo) - lo:min(b, hi) - lo] = False
            stray = np.flatnonzero(changed)
            if stray.size:
                out.append(f"stray write: {stray.size} bytes outside the sampled programs' tiles, "
                           f"first at {space.where(lo + int(stray[0]))}")
        return out

    def run(self) -> float:
        fn = getattr(importlib.import_module(self.launch.module), self.launch.function)
        args = [self.resolve(a) for _, a in self.launch.args]
        t0 = time.perf_counter()
        run_programs(fn, self.launch.grid, self.pids, args, dict(self.launch.constexprs),
                     self.launch.num_warps, self.launch.num_stages)
        return time.perf_counter() - t0

    def verify(self) -> dict[str, list[str]]:
        """Failures by kind ("values", "unwritten", "stray"), one line each, naming the element."""
        failures: dict[str, list[str]] = {"values": [], "unwritten": [], "stray": []}
        worst: dict[str, tuple] = {}
        scale: dict[str, float] = {}                # max|want| over every owned region of an output
        for name, _, want, _ in self.claims:
            if want.size and want.dtype.kind == "f":
                scale[name] = max(scale.get(name, 0.0), float(np.abs(want.astype(np.float64)).max()))
        for name, index, want, pid in self.claims:
            out = self.outputs[name]
            raw = self.region(out.arg, out.shape, out.at)[index]
            got = bf16_values(raw) if out.dtype == "bf16" else raw
            msg, ratio, line = _compare(got, want, out.tol, _origin(index), scale.get(name, 0.0))
            if msg:
                failures["values"].append(f"{name} (program {pid}): {msg}")
            if line and (name not in worst or ratio > worst[name][0]):
                worst[name] = (ratio, line)
            failures["unwritten"].extend(self._unwritten(out, index, pid))
        for name, (_, line) in sorted(worst.items()):
            print(f"{self.launch.kernel} {name}: {line}")
        for space in self.spaces.values():
            failures["stray"].extend(self._stray(space))
        return failures

    def _unwritten(self, out: Output, index, pid) -> list[str]:
        """Owned elements still holding their poison (inputs, i.e. accumulated outputs, excepted:
        the oracle sees those)."""
        item = out.itemsize
        for s, e in _runs(out.shape, index):
            a, b = out.start + s * item, out.start + e * item
            cur = out.space.bytes[a:b].reshape(-1, item)
            inp = self._input_mask(out.space, a, b).reshape(-1, item).any(1)
            bad = np.flatnonzero((cur == out.space.poison).all(1) & ~inp)
            if bad.size:
                where = np.unravel_index(s + int(bad[0]), out.shape)
                return [f"{out.arg} (program {pid}): {bad.size}+ owned elements never written "
                        f"(still poison), first at {tuple(int(i) for i in where)}"]
        return []

def _origin(index) -> tuple:
    """Per indexed axis: ("slice", start) (the axis stays) or ("int", i) (the axis is gone)."""
    index = index if isinstance(index, tuple) else (index,)
    return tuple(("slice", ix.start or 0) if isinstance(ix, slice) else ("int", int(ix))
                 for ix in index)


def _compare(got, want, tol: Tol, origin, scale: float):
    """(failure message or "", err/limit, summary line) for one owned region; `scale` is max|want|
    over all the output's owned regions (the kernel tests' max over the expected array)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, oracle {want.shape}", math.inf, ""

    def at(i):
        """The element's index in the output's logical shape."""
        full, k = [], 0
        for kind, o in origin:
            full.append(o if kind == "int" else o + int(i[k]))
            k += kind == "slice"
        full.extend(int(x) for x in i[k:])
        return tuple(full)

    if tol.rel == 0.0:
        same = got.view(np.uint32) == want.astype(got.dtype).view(np.uint32) \
            if got.dtype == np.float32 else got == want
        bad = np.argwhere(~same)
        if bad.size:
            i = tuple(bad[0])
            return (f"{len(bad)} elements differ ({tol.name}), first at {at(i)}: got {got[i]!r}, "
                    f"want {want[i]!r}"), math.inf, ""
        return "", 0.0, f"bit-exact ({tol.name})"
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g64 - w64)
    err[~np.isfinite(g64)] = np.inf
    scale = max(scale, 1e-30)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    limit = tol.rel * scale
    line = (f"worst |err| {err[i]:.3g} at {at(i)} (got {g64[i]:.8g}, want {w64[i]:.8g}), "
            f"scale {scale:.3g}, limit {limit:.3g} ({tol.name})")
    ratio = err[i] / limit if limit else math.inf
    return (line if not err[i] <= limit else ""), ratio, line


# ---------------------------------------------------------------- registry

REGISTRY: dict[str, object] = {}
SKIPPED = {
    L.RELEASE: "hand-written PTX (plan/kernels/release.ptx), not Triton: the interpret backend "
               "emulates it in Python; its semaphore records are checked by the host tests",
    L.STAGE_IN: "hand-written PTX (plan/kernels/release_stage_in.ptx), not Triton: the interpret "
                "backend emulates it; tests/test_staging_reads.py and test_agreements.py check "
                "what it loads and the layout it copies",
}


def oracle(function: str):
    def register(cls):
        if function in REGISTRY:
            raise ValueError(f"two oracles for {function!r}")
        REGISTRY[function] = cls()
        return cls
    return register


class UnknownKernel(LookupError):
    pass


def check_launch(launch, specs, profile=None, seed: int | None = None, pids=None) -> dict:
    """Run one launch's sampled programs and check them; raises AssertionError listing every
    failure.  `pids` overrides the entry's sample.  Returns {"programs": n, "pids": [...],
    "run_s": interpreter seconds}."""
    entry = REGISTRY.get(launch.function)
    if entry is None:
        raise UnknownKernel(
            f"{launch.kernel} ({launch.label}): no oracle for Triton function {launch.function!r} "
            f"in tests/production_support.py REGISTRY — add one (module docstring says how)")
    case = Case(launch, specs, profile, seed)
    entry.setup(case)
    case.pids = list(entry.programs(case) if pids is None else pids)
    case.prepare(entry)
    seconds = case.run()
    failures = case.verify()
    if any(failures.values()):
        shown = []
        for kind, lines in failures.items():
            shown += lines[:6] + ([f"... {len(lines) - 6} more {kind}"] if len(lines) > 6 else [])
        raise AssertionError(f"{launch.kernel} ({launch.label}), programs {case.pids}:\n  "
                             + "\n  ".join(shown))
    return {"programs": len(case.pids), "run_s": seconds, "pids": case.pids}


# ---------------------------------------------------------------- matmul family

def _splits(case) -> int:
    return dict(case.launch.constexprs).get("SPLIT_K", 1)


def _matmul_dims(case):
    M, N, K = case.scalar("M", "N", "K")
    bm, bn, g = case.const("BLOCK_M", "BLOCK_N", "GROUP_M")
    tiles = cdiv(M, bm) * cdiv(N, bn) * _splits(case)
    if tuple(case.launch.grid) != (tiles, 1, 1):
        raise AssertionError(f"{case.launch.kernel}: grid {case.launch.grid} but {M}×{N} in "
                             f"{bm}×{bn} tiles × {_splits(case)} K splits is {tiles} programs")
    return M, N, K, bm, bn, g


def _matmul_programs(case):
    """The corner tiles (and a ragged group's first) of the first and the last K split."""
    M, N, _, bm, bn, g = _matmul_dims(case)
    tm, tn = cdiv(M, bm), cdiv(N, bn)
    corners = [matmul_pid(pm, pn, M, N, bm, bn, g) for pm, pn in
               ((tm - 1, tn - 1), (0, tn - 1), (tm - 1, 0), (tm - 1 - (tm - 1) % g, 0))]
    last = (_splits(case) - 1) * tm * tn
    return sample(tm * tn * _splits(case), *corners, *(last + c for c in corners))


def matmul_split(pid: int, M: int, N: int, K: int, BM: int, BN: int, BK: int, S: int):
    """(tile pid, K range) of program pid of a split-K matmul: plan/kernels/matmul.py — program
    split · tiles + tile sums chunks [split · per, (split + 1) · per) of cdiv(K, BK)."""
    tiles = cdiv(M, BM) * cdiv(N, BN)
    split, per = pid // tiles, cdiv(cdiv(K, BK), S) * BK
    return pid % tiles, slice(min(K, split * per), min(K, (split + 1) * per)), split


def _tile(case, pid):
    M, N, _, bm, bn, g = _matmul_dims(case)
    pm, pn = matmul_tile(pid % (cdiv(M, bm) * cdiv(N, bn)), M, N, bm, bn, g)
    return pn, _block(pm, bm, M), _block(pn, bn, N)


def _ssq_input(case, x: np.ndarray) -> None:
    """The producer's per-row partial sums of squares of the residual x (M, K) the norm prologue
    reads: SSQ_PARTS column chunks (as matmul_residual's column tiles write them)."""
    parts = case.const("SSQ_PARTS")
    bounds = np.linspace(0, x.shape[1], parts + 1).astype(int)
    case.input("ssq_ptr", values=np.stack([(x[:, a:b] * x[:, a:b]).sum(1, dtype=np.float32)
                                           for a, b in zip(bounds[:-1], bounds[1:])]))


@oracle("matmul")
class _Matmul:
    """c = epilogue(bf(A) @ bf(B)) (plan/kernels/matmul.py); the oracle is that formula with the
    reference's bf16, epilogues as NUMERICS writes them (out_proj, mlp_backward)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        a_t, b_t, epi = case.const("A_T", "B_T", "EPILOGUE")
        a = case.input("a_ptr", (K, M) if a_t else (M, K))
        b = case.input("b_ptr", (N, K) if b_t else (K, N), scale=0.1)
        case.cache["A"] = a.T if a_t else a                           # (M, K)
        case.cache["B"] = b.T if b_t else b                           # (K, N)
        if epi == meta.EPI_RESIDUAL:
            case.input("aux_ptr", (M, N))
        if epi == meta.EPI_SWIGLU_BWD:
            case.input("aux_ptr", (M, 2 * N))                         # [a | b] of the forward
            case.output("c_ptr", (M, 2 * N), T_ULP)
        elif _splits(case) > 1:                                       # (splits, M, N) partials
            case.output("c_ptr", (_splits(case), M, N), T_SAME)
        else:
            case.output("c_ptr", (M, N), T_ULP if epi == meta.EPI_BF16 else T_SAME)

    def programs(self, case):
        return _matmul_programs(case)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        N = case.scalar("N")
        epi = case.const("EPILOGUE")
        A, B = case.cache["A"], case.cache["B"]
        if _splits(case) > 1:                # partial `split` of the K chunks it owns
            M, K = case.scalar("M", "K")
            bm, bn, bk = case.const("BLOCK_M", "BLOCK_N", "BLOCK_K")
            _, ks, split = matmul_split(pid, M, N, K, bm, bn, bk, _splits(case))
            yield "c_ptr", (split, rows, cols), ref.bf16(A[rows, ks]) @ ref.bf16(B[ks, cols])
            return
        acc = ref.bf16(A[rows]) @ ref.bf16(B[:, cols])
        if epi == meta.EPI_F32:
            yield "c_ptr", (rows, cols), acc
        elif epi == meta.EPI_BF16:
            yield "c_ptr", (rows, cols), ref.bf16(acc)
        elif epi == meta.EPI_RESIDUAL:
            yield "c_ptr", (rows, cols), case.data["aux_ptr"][rows, cols] + acc
        elif epi == meta.EPI_SWIGLU_BWD:
            ab = case.data["aux_ptr"]
            a, b = ab[rows, cols], ab[rows, N + cols.start:N + cols.stop]
            one = np.float32(1)
            with np.errstate(over="ignore"):
                ea = one + np.exp(-a)
            sig = one / ea
            da = acc * b * (sig * (one + a * (one - sig)))            # NUMERICS mlp_backward
            db = acc * (a / ea)
            yield "c_ptr", (rows, cols), ref.bf16(da)
            yield "c_ptr", (rows, slice(N + cols.start, N + cols.stop)), ref.bf16(db)
        else:
            raise AssertionError(f"{case.launch.kernel}: no oracle for EPILOGUE={epi}")


@oracle("matmul_residual")
class _MatmulResidual:
    """out = x + bf(A) @ bf(B)ᵀ (the reference out_proj / mlp's residual add) and each column
    tile's per-row Σ out² (of the oracle's out: ELEMENTWISE)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        case.input("a_ptr", (M, K))
        case.input("b_ptr", (N, K), scale=0.1)
        case.input("x_ptr", (M, N))
        case.output("out_ptr", (M, N), T_SAME)
        case.output("ssq_ptr", (cdiv(N, case.const("BLOCK_N")), M), T_ELEM)

    def programs(self, case):
        return _matmul_programs(case)

    def expect(self, case, pid):
        pn, rows, cols = _tile(case, pid)
        d = case.data
        out = d["x_ptr"][rows, cols] + ref.bf16(d["a_ptr"][rows]) @ ref.bf16(d["b_ptr"][cols]).T
        yield "out_ptr", (rows, cols), out
        yield "ssq_ptr", (pn, rows), (out * out).sum(1, dtype=np.float32)


@oracle("matmul_rotary")
class _MatmulRotary:
    """qkv16 = bf(rotary(h16 @ bf(W)ᵀ)), h16 the norm's bf16 rows: reference qkv then rotary on
    q and k heads."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        d = case.const("HEAD_DIM")
        x = 2.0 * case.rng.standard_normal((M, K), dtype=np.float32)
        case.input("h16_ptr", values=ref.bf16(ref.rmsnorm(x)[0]))
        case.input("w_ptr", (N, K))
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=M, head_dim=d))
        case.input("rope_ptr", values=np.concatenate([cos, sin], axis=1))
        case.output("qkv_ptr", (M, N), T_ULP)

    def programs(self, case):
        return _matmul_programs(case)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        d, rotated = case.const("HEAD_DIM", "ROTATED")
        M = case.scalar("M")
        acc = case.data["h16_ptr"][rows] @ ref.bf16(case.data["w_ptr"][cols]).T
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=M, head_dim=d))
        out = acc.copy()
        for j in range((cols.stop - cols.start) // d):
            if cols.start // d + j < rotated:
                out[:, j * d:(j + 1) * d] = ref.rotary(acc[:, j * d:(j + 1) * d], cos[rows], sin[rows])
        yield "qkv_ptr", (rows, cols), ref.bf16(out)


@oracle("matmul_swiglu")
class _MatmulSwiglu:
    """ab = [a | b], z16 = bf(silu(a)·b) from h16 = bf(rmsnorm(x)): the reference mlp stage on the
    tile (x is the oracle's; the kernel reads the bf16 rows rmsnorm_rows would write)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        x = 2.0 * case.rng.standard_normal((M, K), dtype=np.float32)
        case.cache["x"] = x
        case.input("h16_ptr", values=ref.bf16(ref.rmsnorm(x)[0]))
        case.input("wg_ptr", (N, K), scale=0.1)
        case.input("wu_ptr", (N, K), scale=0.1)
        case.output("ab_ptr", (M, 2 * N), T_ULP)
        case.output("z_ptr", (M, N), T_Z16)

    def programs(self, case):
        return _matmul_programs(case)

    def expect(self, case, pid):
        pn, rows, cols = _tile(case, pid)
        N, K = case.scalar("N", "K")
        no_down = np.zeros((K, cols.stop - cols.start), np.float32)   # the oracle's, not an input
        m = ref.mlp(case.cache["x"][rows], case.data["wg_ptr"][cols], case.data["wu_ptr"][cols],
                    no_down)
        yield "ab_ptr", (rows, cols), m.a
        yield "ab_ptr", (rows, slice(N + cols.start, N + cols.stop)), m.b
        yield "z_ptr", (rows, cols), ref.bf16(m.z)


class _NormRows:
    """A row kernel that writes h16 (T, D) bf16 and rstd (T,) for BLOCK_R rows per program."""

    def outputs(self, case):
        T, D = case.scalar("T"), case.const("D")
        case.output("h16_ptr", (T, D), T_ULP)
        case.output("rstd_ptr", (T,), T_ELEM)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def rows(self, case, pid) -> slice:
        return _block(pid, case.const("BLOCK_R"), case.scalar("T"))


@oracle("rmsnorm_rows")
class _RmsnormRows(_NormRows):
    """h16 = bf(rmsnorm(x)) and rstd from x and its producer's partial sums of squares: the
    reference rmsnorm (the MLP sites' norm, formed once for the SwiGLU forward)."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        _ssq_input(case, case.input("x_ptr", (T, D), scale=3.0))
        self.outputs(case)

    def expect(self, case, pid):
        rows = self.rows(case, pid)
        y, r = ref.rmsnorm(case.data["x_ptr"][rows])
        yield "h16_ptr", (rows,), ref.bf16(y)
        yield "rstd_ptr", (rows,), r


@oracle("matmul_delta")
class _MatmulDelta:
    """dO = bf(dres) @ bf(Wo) (reference out_proj_backward) and delta = Σ_d dO·o per head."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        d = case.const("HEAD_DIM")
        case.input("a_ptr", (M, K))
        case.input("b_ptr", (K, N), scale=0.1)                        # Wo (D, H·d) = (K, N)
        case.input("o_ptr", (M, N))
        case.output("do_ptr", (M, N), T_SAME)
        case.output("delta_ptr", (N // d, M), T_DELTA)

    def programs(self, case):
        return _matmul_programs(case)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        d = case.const("HEAD_DIM")
        o = case.data["o_ptr"][rows, cols]
        do, _ = ref.out_proj_backward(case.data["a_ptr"][rows], o, case.data["b_ptr"][:, cols])
        yield "do_ptr", (rows, cols), do
        for j in range((cols.stop - cols.start) // d):
            head = cols.start // d + j
            delta = (do[:, j * d:(j + 1) * d] * o[:, j * d:(j + 1) * d]).sum(-1, dtype=np.float32)
            yield "delta_ptr", (head, rows), delta


# ---------------------------------------------------------------- attention

def _attention_inputs(case):
    T = case.scalar("T")
    H, G, d = case.const("HEADS", "KV_HEADS", "HEAD_DIM")
    qkv = case.input("qkv_ptr", (T, (H + 2 * G) * d))
    q, k, v = qkv[:, :H * d], qkv[:, H * d:(H + G) * d], qkv[:, (H + G) * d:]
    return T, H, G, d, q, k, v


def _lse(q, k, T, H, G, d):
    """(H, T) fp32 log-sum-exp of the causal scores bf(q)bf(k)ᵀ·scale, in float64."""
    scale = float(ref.attention_scale(d))
    causal = np.triu(np.ones((T, T), bool), 1)
    out = np.empty((H, T), np.float32)
    for h in range(H):
        kv = h // (H // G)
        s = (ref.bf16(q[:, h * d:(h + 1) * d]).astype(np.float64)
             @ ref.bf16(k[:, kv * d:(kv + 1) * d]).astype(np.float64).T) * scale
        s[causal] = -np.inf
        m = s.max(-1)
        out[h] = m + np.log(np.exp(s - m[:, None]).sum(-1))
    return out


def _scores(q, k, rows, cols, head, kv, d):
    """s (R, C) fp32 = bf(q)·bf(k)ᵀ·scale of query rows × key cols, −inf above the diagonal."""
    s = (ref.bf16(q[rows, head * d:(head + 1) * d]) @ ref.bf16(k[cols, kv * d:(kv + 1) * d]).T)
    s = s * ref.attention_scale(d)
    r = np.arange(rows.start, rows.stop)[:, None]
    c = np.arange(cols.start, cols.stop)[None, :]
    return np.where(r >= c, s, np.float32(-np.inf)).astype(np.float32)


@oracle("attention_fwd")
class _AttentionFwd:
    """One (query block, kv chunk, head) program: the chunk's row max m_c, row sum l_c and
    unnormalized acc_c = Σ bf(exp(s − m))·bf(v) over its kv blocks, with the running max m of the
    flash recurrence block by block (p is rounded against it: NUMERICS.md's one ulp of p)."""

    def setup(self, case):
        T, H, G, d, q, k, v = _attention_inputs(case)
        sp = attention_split_of(case)
        case.output("o_part_ptr", (sp.fwd_slots, T, H * d), T_ATT_OUT)
        case.output("ml_part_ptr", (sp.fwd_slots, 2, H, T), T_LSE)

    def programs(self, case):
        sp = attention_split_of(case)
        progs = sp.fwd_programs()
        # the first program of a ragged last chunk, and the full chunk before it
        ragged = [i for i, (m, c, _) in enumerate(progs) if sp.fwd_chunk_trips(m, c) < sp.fwd_chunk]
        return sample(len(progs), *[i for i in ragged[:1] for i in (i - 1, i) if i >= 0])

    def expect(self, case, pid):
        T, H, d = case.scalar("T"), case.const("HEADS"), case.const("HEAD_DIM")
        sp = attention_split_of(case)
        m, c, head = sp.fwd_programs()[pid]
        q, k, v = (case.data["qkv_ptr"][:, a:b] for a, b in _qkv_cols(case))
        kv = head // sp.group
        rows = _block(m, sp.block_m, T)
        mi = np.full(rows.stop - rows.start, -np.inf, np.float32)
        li = np.zeros_like(mi)
        acc = np.zeros((rows.stop - rows.start, d), np.float32)
        for b in range(c * sp.fwd_chunk, c * sp.fwd_chunk + sp.fwd_chunk_trips(m, c)):
            cols = _block(b, sp.block_n, T)
            s = _scores(q, k, rows, cols, head, kv, d)
            m_new = np.maximum(mi, s.max(1))
            alpha = np.exp(mi - m_new)
            p = np.exp(s - m_new[:, None])
            li = li * alpha + p.sum(1, dtype=np.float32)
            acc = acc * alpha[:, None] + ref.bf16(p) @ ref.bf16(v[cols, kv * d:(kv + 1) * d])
            mi = m_new
        yield "ml_part_ptr", (c, 0, head, rows), mi
        yield "ml_part_ptr", (c, 1, head, rows), li
        yield "o_part_ptr", (c, rows, slice(head * d, (head + 1) * d)), acc


def _qkv_cols(case):
    H, G, d = case.const("HEADS", "KV_HEADS", "HEAD_DIM")
    return (0, H * d), (H * d, (H + G) * d), ((H + G) * d, (H + 2 * G) * d)


def _slots(shape_of_slot, sp: AttentionSplit, used, rng, blocks: int, block: int, axis: int):
    """Random partials (slots, …) in the slots each block uses, NaN in the rest (a merge that
    reads a slot its block did not fill sees NaN)."""
    x = rng.standard_normal(shape_of_slot, dtype=np.float32)
    for b in range(blocks):
        for c in range(shape_of_slot[0]):
            if not used(b, c):
                index = [c] + [slice(None)] * (len(shape_of_slot) - 1)
                index[axis] = slice(b * block, (b + 1) * block)
                x[tuple(index)] = np.nan
    return x


@oracle("attention_fwd_merge")
class _AttentionFwdMerge:
    """o32, o16, lse of one (query block, head) from its chunks' partials (random here, NaN in the
    slots the block does not use), merged in chunk order as numpy does it."""

    def setup(self, case):
        T, H, d = case.scalar("T"), case.const("HEADS"), case.const("HEAD_DIM")
        sp = attention_split_of(case)
        used = lambda m, c: c < sp.fwd_chunks(m)  # noqa: E731
        o = _slots((sp.fwd_slots, T, H * d), sp, used, case.rng, sp.q_blocks, sp.block_m, 1)
        ml = _slots((sp.fwd_slots, 2, H, T), sp, used, case.rng, sp.q_blocks, sp.block_m, 3)
        ml[:, 0] *= 4                                                   # row maxima
        ml[:, 1] = np.abs(ml[:, 1]) * 8 + 1                             # row sums ≥ 1
        case.input("o_part_ptr", values=o)
        case.input("ml_part_ptr", values=ml)
        case.output("o32_ptr", (T, H * d), T_ELEM)
        case.output("o16_ptr", (T, H * d), T_ULP)
        case.output("lse_ptr", (H, T), T_ELEM)

    def programs(self, case):
        n = case.launch.grid[0]
        return sample(n, case.const("HEADS"))

    def expect(self, case, pid):
        T, H, d = case.scalar("T"), case.const("HEADS"), case.const("HEAD_DIM")
        sp = attention_split_of(case)
        m, head = sp.fwd_merge_programs()[pid]
        rows, cols = _block(m, sp.block_m, T), slice(head * d, (head + 1) * d)
        n = sp.fwd_chunks(m)
        mc = case.data["ml_part_ptr"][:n, 0, head, rows]                # (n, R)
        lc = case.data["ml_part_ptr"][:n, 1, head, rows]
        M = mc.max(0)
        w = np.exp(mc - M)
        l, acc = np.zeros_like(M), np.zeros((rows.stop - rows.start, d), np.float32)
        for c in range(n):
            l = l + lc[c] * w[c]
            acc = acc + case.data["o_part_ptr"][c, rows, cols] * w[c][:, None]
        o = acc / l[:, None]
        yield "o32_ptr", (rows, cols), o
        yield "o16_ptr", (rows, cols), ref.bf16(o)
        yield "lse_ptr", (head, rows), M + np.log(l)


@oracle("attention_bwd")
class _AttentionBwd:
    """One (kv block, trip chunk, kv head) program: the fp32 partial dk′ = Σ bf(ds)ᵀ·bf(q′),
    dv = Σ bf(p)ᵀ·bf(dO) over its (query head, query block) trips, and each trip's bf(ds)ᵀ tile;
    p = exp(s − lse), ds = p·(dp − delta)·scale with the forward's lse and delta (reference)."""

    def setup(self, case):
        T, H, G, d, q, k, v = _attention_inputs(case)
        do = case.input("do_ptr", (T, H * d))
        at = ref.attention(q, k, v, d)
        case.input("lse_ptr", values=_lse(q, k, T, H, G, d))
        case.input("delta_ptr", values=np.ascontiguousarray(
            (do * at.o).reshape(T, H, d).sum(-1, dtype=np.float32).T))
        sp = attention_split_of(case)
        case.output("kv_part_ptr", (sp.bwd_slots, T, 2 * G * d), T_ATT_GRAD)
        case.output("ds_ptr", (H, T, T), T_ATT_GRAD16)

    def programs(self, case):
        sp = attention_split_of(case)
        progs = sp.dkdv_programs()
        # a chunk that crosses from one query head to the next, and a ragged last chunk
        cross = [i for i, (n, c, _) in enumerate(progs)
                 if len({j for j, _ in sp.dkdv_chunk_pairs(n, c)}) > 1]
        ragged = [i for i, (n, c, _) in enumerate(progs)
                  if len(sp.dkdv_chunk_pairs(n, c)) < sp.bwd_chunk]
        return sample(len(progs), *cross[:1], *ragged[:1])

    def expect(self, case, pid):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        n, c, g = sp.dkdv_programs()[pid]
        q, k, v = (case.data["qkv_ptr"][:, a:b] for a, b in _qkv_cols(case))
        do, lse, delta = case.data["do_ptr"], case.data["lse_ptr"], case.data["delta_ptr"]
        cols = _block(n, sp.block_n, T)                                 # this program's kv rows
        kd = slice(g * d, (g + 1) * d)
        dk = np.zeros((cols.stop - cols.start, d), np.float32)
        dv = np.zeros_like(dk)
        for j, m in sp.dkdv_chunk_pairs(n, c):
            head = g * sp.group + j
            rows, hd = _block(m, sp.block_m, T), slice(head * d, (head + 1) * d)
            p = np.exp(_scores(q, k, rows, cols, head, g, d) - lse[head, rows][:, None])
            dp = ref.bf16(do[rows, hd]) @ ref.bf16(v[cols, kd]).T
            ds = ref.bf16(p * (dp - delta[head, rows][:, None]) * ref.attention_scale(d))
            yield "ds_ptr", (head, cols, rows), ds.T
            dk += ds.T @ ref.bf16(q[rows, hd])
            dv += ref.bf16(p).T @ ref.bf16(do[rows, hd])
        yield "kv_part_ptr", (c, cols, kd), dk
        yield "kv_part_ptr", (c, cols, slice((G + g) * d, (G + g + 1) * d)), dv


@oracle("attention_bwd_dq")
class _AttentionBwdDq:
    """dQ programs: bf(rotary_backward(Σ_n bf(ds)·bf(k′))) of one (query block, head) from the
    bf(ds)ᵀ tiles (random in the tiles attention_bwd writes, 0 above the diagonal, NaN elsewhere);
    merge programs: bf(rotary_backward(Σ_c dk′_c)), bf(Σ_c dv_c) of one (kv block, kv head) from
    random partials (NaN in the slots the block does not use), summed in slot order."""

    def setup(self, case):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        case.input("qkv_ptr", (T, (H + 2 * G) * d))
        ds = np.full((H, T, T), np.nan, np.float32)                     # [head, kv row, query row]
        causal = np.tril(np.ones((T, T), bool)).T                       # kv row ≤ query row
        for n in range(sp.kv_blocks):
            kv_rows = _block(n, sp.block_n, T)
            q_rows = slice(sp.first_q(n) * sp.block_m, T)
            tile = case.rng.standard_normal((H, kv_rows.stop - kv_rows.start,
                                             T - q_rows.start), dtype=np.float32) * 1e-2
            ds[:, kv_rows, q_rows] = np.where(causal[kv_rows, q_rows], tile, 0)
        case.input("ds_ptr", values=ds)
        used = lambda n, c: c < sp.dkdv_chunks(n)  # noqa: E731
        case.input("kv_part_ptr", values=_slots((sp.bwd_slots, T, 2 * G * d), sp, used, case.rng,
                                                sp.kv_blocks, sp.block_n, 1))
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=T, head_dim=d))
        case.cache["cos_sin"] = cos, sin
        case.input("rope_ptr", values=np.concatenate([cos, sin], axis=1))
        case.output("dqkv_ptr", (T, (H + 2 * G) * d), T_ULP)

    def programs(self, case):
        n, first_merge = case.launch.grid[0], case.const("HEADS") * attention_split_of(case).q_blocks
        return sample(n, first_merge - 1, first_merge, first_merge // 2 + 1)

    def expect(self, case, pid):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        kind, block, head = sp.dq_programs()[pid]
        cos, sin = case.cache["cos_sin"]
        k = case.data["qkv_ptr"][:, H * d:(H + G) * d]
        if kind == "dq":
            rows, g = _block(block, sp.block_m, T), head // sp.group
            keys = slice(0, sp.fwd_kv_blocks(block) * sp.block_n)
            ds = case.data["ds_ptr"][head, keys, rows].T                # (BM, keys), bf16 values
            dq = ds @ ref.bf16(k[keys, g * d:(g + 1) * d])
            yield ("dqkv_ptr", (rows, slice(head * d, (head + 1) * d)),
                   ref.bf16(ref.rotary_backward(dq, cos[rows], sin[rows])))
            return
        rows, g = _block(block, sp.block_n, T), head
        part = case.data["kv_part_ptr"]
        kd, vd = slice(g * d, (g + 1) * d), slice((G + g) * d, (G + g + 1) * d)
        dk, dv = part[0, rows, kd], part[0, rows, vd]
        for c in range(1, sp.dkdv_chunks(block)):
            dk, dv = dk + part[c, rows, kd], dv + part[c, rows, vd]
        yield ("dqkv_ptr", (rows, slice((H + g) * d, (H + g + 1) * d)),
               ref.bf16(ref.rotary_backward(dk, cos[rows], sin[rows])))
        yield "dqkv_ptr", (rows, slice((H + G + g) * d, (H + G + g + 1) * d)), ref.bf16(dv)


# ---------------------------------------------------------------- row kernels

def _norm_inputs(case, T, D):
    """x, its rstd, and dy as DY_PARTS split-K partials (case.data["dy"]: their sum in order)."""
    x = case.input("x_ptr", (T, D), scale=2.0)
    _, r = ref.rmsnorm(x)
    case.input("rstd_ptr", values=r)
    parts = case.input("dy_ptr", (case.const("DY_PARTS"), T, D))
    dy = parts[0]
    for p in parts[1:]:
        dy = dy + p
    case.data["dy"] = dy
    return x


def _rows_expect(case, rows, has_gain, accumulate, write_bf16):
    x, r, dy = case.data["x_ptr"][rows], case.data["rstd_ptr"][rows], case.data["dy"][rows]
    if has_gain:
        dy = dy * case.data["g_ptr"]
    dx = ref.rmsnorm_backward(dy, x * r[:, None], r)
    if accumulate:
        dx = case.data["dx_ptr"][rows] + dx
    yield "dx_ptr", (rows,), dx
    if write_bf16:
        yield "dx16_ptr", (rows,), ref.bf16(dx)


@oracle("residual_norm")
class _ResidualNorm(_NormRows):
    """out = x + Σ partials in split order (the mlp down's residual add), then h16 =
    bf(rmsnorm(out)[·g]) and rstd: the reference mlp stage's residual and the norm after it
    (the next layer's qkv norm, or final_norm with g_final)."""

    def setup(self, case):
        T, D, parts = case.scalar("T"), case.const("D"), case.const("PARTS")
        x = case.input("x_ptr", (T, D), scale=3.0)
        total = None
        for p in case.input("part_ptr", (parts, T, D)):
            total = p if total is None else total + p
        case.data["out"] = x + total
        if case.const("HAS_GAIN"):
            case.input("g_ptr", values=1 + 0.1 * case.rng.standard_normal(D, dtype=np.float32))
        case.output("out_ptr", (T, D), EXACT)
        self.outputs(case)

    def expect(self, case, pid):
        rows = self.rows(case, pid)
        out = case.data["out"][rows]
        yield "out_ptr", (rows,), out
        if case.const("HAS_GAIN"):
            f = ref.final_norm(out, case.data["g_ptr"])
            yield "h16_ptr", (rows,), ref.bf16(f.hf)
            yield "rstd_ptr", (rows,), f.r
        else:
            y, r = ref.rmsnorm(out)
            yield "h16_ptr", (rows,), ref.bf16(y)
            yield "rstd_ptr", (rows,), r


@oracle("rmsnorm_bwd")
class _RmsnormBwd:
    """dx [+]= rmsnorm_backward(dy [·g], x·r, r), dx16 = bf(dx): the reference stage."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        has_gain, acc, bf = case.const("HAS_GAIN", "ACCUMULATE", "WRITE_BF16")
        _norm_inputs(case, T, D)
        if has_gain:
            case.input("g_ptr", values=1 + 0.1 * case.rng.standard_normal(D, dtype=np.float32))
        if acc:
            case.input("dx_ptr", (T, D))                              # the residual gradient so far
        case.output("dx_ptr", (T, D), T_ELEM)
        if bf:
            case.output("dx16_ptr", (T, D), T_ULP)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        T = case.scalar("T")
        yield from _rows_expect(case, _block(pid, case.const("BLOCK_R"), T),
                                *case.const("HAS_GAIN", "ACCUMULATE", "WRITE_BF16"))


@oracle("rmsnorm_bwd_gain")
class _RmsnormBwdGain:
    """Row programs: the gained rmsnorm backward; column programs: dg = Σ_rows dy·y — the
    reference final_norm_backward (the same formula embed_backward uses for dg_embed)."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        br, cols = case.const("BLOCK_R", "GAIN_COLS")
        if case.launch.grid[0] != cdiv(T, br) + cdiv(D, cols):
            raise AssertionError(f"{case.launch.kernel}: grid {case.launch.grid} is not "
                                 f"{cdiv(T, br)} row + {cdiv(D, cols)} column programs")
        x = _norm_inputs(case, T, D)
        g = case.input("g_ptr", values=1 + 0.1 * case.rng.standard_normal(D, dtype=np.float32))
        y, r = x * case.data["rstd_ptr"][:, None], case.data["rstd_ptr"]
        case.cache["dg"] = ref.final_norm_backward(case.data["dy"], y, r, g)[1]
        case.output("dx_ptr", (T, D), T_ELEM)
        if case.const("WRITE_BF16"):
            case.output("dx16_ptr", (T, D), T_ULP)
        case.output("dg_ptr", (D,), T_GAIN_SUM)

    def programs(self, case):
        rows = cdiv(case.scalar("T"), case.const("BLOCK_R"))
        n = case.launch.grid[0]
        return sample(n, rows - 1, rows, rows + (n - rows) // 2)

    def expect(self, case, pid):
        T, D = case.scalar("T"), case.const("D")
        kind, block = rmsnorm_bwd_gain_program(pid, T, case.const("BLOCK_R"))
        if kind == "rows":
            yield from _rows_expect(case, _block(block, case.const("BLOCK_R"), T), True, False,
                                    case.const("WRITE_BF16"))
        else:
            cols = _block(block, case.const("GAIN_COLS"), D)
            yield "dg_ptr", (cols,), case.cache["dg"][cols]


def _token_ids(case, T, V, hot):
    """(T,) ids: random, each `hot` token repeated at several rows (first and last row among
    them), and V-1 present: chains for next-row links and multi-row sums."""
    ids = case.rng.integers(0, V, T).astype(np.uint32)
    rows = case.rng.permutation(T)
    k = 0
    for tok in hot:
        n = 2 + int(case.rng.integers(0, 5))
        ids[rows[k:k + n]] = tok
        k += n
    ids[0], ids[T - 1], ids[T // 2] = hot[0], hot[0], V - 1
    return ids


def _next_rows(ids: np.ndarray) -> np.ndarray:
    """next[r] = the next row holding the same id, else T (embed_grad's links, by definition)."""
    T = len(ids)
    out = np.full(T, T, np.int32)
    last: dict[int, int] = {}
    for r in range(T - 1, -1, -1):
        out[r] = last.get(int(ids[r]), T)
        last[int(ids[r])] = r
    return out


@oracle("embed_fwd")
class _EmbedFwd:
    """emb, rstd, x: the reference embed stage; h16, rstd0: the reference rmsnorm of x (layer 0's
    attention norm); rope: the reference rotary tables; next-row links."""

    def setup(self, case):
        T, D, d = case.scalar("T"), case.const("D"), case.const("HEAD_DIM")
        V = case.profile.vocab
        ids = _token_ids(case, T, V, hot=[int(t) for t in case.rng.integers(0, V, 6)])
        case.input("ids_ptr", values=ids)
        case.input("table_ptr", (V, D))
        case.input("g_ptr", values=1 + 0.1 * case.rng.standard_normal(D, dtype=np.float32))
        case.cache["next"] = _next_rows(ids)
        case.cache["rope"] = np.concatenate(ref.rotary_tables(
            types.SimpleNamespace(context=T, head_dim=d)), axis=1)
        for name, shape, tol in (("emb_ptr", (T, D), EXACT), ("rstd_ptr", (T,), T_ELEM),
                                 ("x_ptr", (T, D), T_ELEM), ("rope_ptr", (T, d), T_ELEM),
                                 ("next_ptr", (T,), EXACT), ("h16_ptr", (T, D), T_ULP),
                                 ("rstd0_ptr", (T,), T_ELEM)):
            case.output(name, shape, tol)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        rows = _block(pid, case.const("BLOCK_R"), case.scalar("T"))
        e = ref.embed(case.data["table_ptr"], case.data["g_ptr"], case.data["ids_ptr"][rows])
        yield "emb_ptr", (rows,), e.e
        yield "rstd_ptr", (rows,), e.r
        yield "x_ptr", (rows,), e.x
        yield "rope_ptr", (rows,), case.cache["rope"][rows]
        yield "next_ptr", (rows,), case.cache["next"][rows]
        y, r0 = ref.rmsnorm(e.x)
        yield "h16_ptr", (rows,), ref.bf16(y)
        yield "rstd0_ptr", (rows,), r0


class _Learner:
    """Shared by the fused AdamW oracles: t = t_base + doorbell, fresh P/M/V of a parameter
    window written as inputs, and the reference learner on a window of the parameter table."""
    T_BASE, DOORBELL = 4998, 7

    @classmethod
    def start(cls, case):
        case.run_scalars["t_base"] = cls.T_BASE
        case.input("doorbell_ptr", values=np.array([cls.DOORBELL], np.uint32))

    @staticmethod
    def planes(case, arg: str, at: int, n: int, key: str):
        """Fresh P, M, V of n elements at element `at` of parameter pointer `arg` (P plane;
        M, V NPARAM and 2·NPARAM further), kept as case.data[f"{key}{P|M|V}"]."""
        N = case.scalar("NPARAM")
        # V ≥ 1e-6 ≫ (1 − β2)·g² (≈ 6e-10 for the weight_grad oracle's |g| ≈ 8e-4): a product's
        # gradient differs from numpy's by SAME_OPERANDS (another accumulation order), which
        # step·m/√v would amplify where v ≈ 0; the bit-for-bit check on the same gradient is
        # tests/test_kernels_weight_grad.py's
        vals = (0.02 * case.rng.standard_normal(n, dtype=np.float32),
                1e-3 * case.rng.standard_normal(n, dtype=np.float32),
                1e-6 * (1 + np.abs(case.rng.standard_normal(n, dtype=np.float32))))
        for plane, (name, v) in enumerate(zip("PMV", vals)):
            case.input(arg, values=v, at=plane * N + at, key=f"{key}{name}")

    @classmethod
    def update(cls, case, key: str, g: np.ndarray, decayed: bool):
        """The reference learner's (P, M, V) for planes `key` and gradient g (flat)."""
        n = g.size
        one = types.SimpleNamespace(offset=0, end=n, decay=decayed)
        prof = types.SimpleNamespace(parameter_count=n, learner=case.profile.learner,
                                     parameters=[one])
        d = case.data
        return ref.adamw(prof, d[key + "P"], d[key + "M"], d[key + "V"],
                         np.ascontiguousarray(g, np.float32).reshape(-1), cls.T_BASE + cls.DOORBELL)

    @staticmethod
    def outputs(case, arg: str, shape, prefix: str) -> None:
        N = case.scalar("NPARAM")
        for plane, name in enumerate("PMV"):
            case.output(arg, shape, T_ADAMW, at=plane * N, key=prefix + name)


def _e_blocks(case, blocks) -> None:
    """Fresh P, M, V of E's vocabulary blocks `blocks` (BLOCK_V rows each) as inputs, keyed E{b}."""
    V, D, bv = case.scalar("V"), case.const("D"), case.const("BLOCK_V")
    for b in blocks:
        rows = _block(b, bv, V)
        _Learner.planes(case, "e_ptr", rows.start * D, (rows.stop - rows.start) * D, f"E{b}")


def _e_outputs(case) -> None:
    """E's P, M, V planes and the w1 window, declared as outputs."""
    V, D = case.scalar("V"), case.const("D")
    _Learner.outputs(case, "e_ptr", (V, D), "E")
    case.output("w1_ptr", (case.const("W1_WORDS"),), EXACT)


def _present_rows(case, rows: slice) -> np.ndarray:
    """The rows of `rows` that some id of the context holds, increasing."""
    ids = case.data["ids_ptr"].astype(np.int64)
    return np.intersect1d(ids, np.arange(rows.start, rows.stop))


def _row_words(case, rows: slice, pick: np.ndarray, values: np.ndarray):
    """(key, index, value) of E's rows `pick` (a subset of `rows`, values (len(rows), D)) in the
    w1 window: one region per row that the window reaches."""
    D, w1 = case.const("D", "W1_WORDS")
    for r in pick:
        words = slice(int(r) * D, min((int(r) + 1) * D, w1))
        if words.start < words.stop:
            yield "w1_ptr", (words,), values[r - rows.start][:words.stop - words.start]


@oracle("embed_decay")
class _EmbedDecay:
    """E's absent rows (no id of the context holds them): the reference learner with g = 0
    (decayed), their w1 words zero; the present rows and their w1 words untouched (watched).
    Program pid runs vocabulary blocks pid, pid + programs, …; only the sampled programs' blocks
    of the planes are written as inputs."""

    def setup(self, case):
        T, V = case.scalar("T", "V")
        bv = case.const("BLOCK_V")
        n, blocks = case.launch.grid[0], cdiv(V, bv)
        if n > blocks:
            raise AssertionError(f"{case.launch.kernel}: grid {n} for {blocks} vocabulary blocks")
        _Learner.start(case)
        case.hint = sample(n)
        case.cache["blocks"] = {pid: list(range(pid, blocks, n)) for pid in case.hint}
        mine = [b for pid in case.hint for b in case.cache["blocks"][pid]]
        # a few present rows in blocks the sampled programs run (the first block among them,
        # which the w1 window covers): both kinds of row in one block
        hot = [min(int(b * bv + case.rng.integers(0, bv)), V - 1) for b in mine[::7] + [0]]
        case.input("ids_ptr", values=_token_ids(case, T, V, hot))
        _e_blocks(case, mine)
        _e_outputs(case)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        V = case.scalar("V")
        D, bv = case.const("D", "BLOCK_V")
        for b in case.cache["blocks"][pid]:
            rows = _block(b, bv, V)
            absent = np.setdiff1d(np.arange(rows.start, rows.stop), _present_rows(case, rows))
            zero = np.zeros((rows.stop - rows.start, D), np.float32)
            new = [x.reshape(-1, D) for x in _Learner.update(case, f"E{b}", zero, True)]
            for r in absent:
                for name, x in zip("PMV", new):
                    yield "E" + name, (slice(int(r), int(r) + 1),), x[r - rows.start][None]
            yield from _row_words(case, rows, absent, zero)


@oracle("embed_grad")
class _EmbedGrad:
    """dE rows = Σ de over the rows holding each id, increasing row order (np.add.at, sequential:
    the reference embed_backward's sum); w1 = dE's first W1_WORDS words of the present rows; E's
    present rows of P, M, V: the reference learner on those sums (decayed); the absent rows and
    their w1 words untouched (watched: embed_decay's); the last program: the two gains from dgain
    (not decayed).  Only the sampled programs' rows of the planes are written as inputs."""

    def setup(self, case):
        T, V = case.scalar("T", "V")
        D, bv = case.const("D", "BLOCK_V")
        n = case.launch.grid[0]
        if n != cdiv(V, bv) + 1:
            raise AssertionError(f"{case.launch.kernel}: grid {n} is not cdiv({V}, {bv}) + 1")
        _Learner.start(case)
        case.hint = sample(n)
        hot = [min(int(p * bv + case.rng.integers(0, bv)), V - 1) for p in case.hint[:-1]
               for _ in range(3)]
        ids = _token_ids(case, T, V, hot)
        case.input("ids_ptr", values=ids)
        case.input("next_ptr", values=_next_rows(ids))
        case.input("de_ptr", (T, D))
        case.input("dgain_ptr", (2, D), scale=1e-3)
        _e_blocks(case, case.hint[:-1])
        for g in ("gain0_ptr", "gain1_ptr"):
            _Learner.planes(case, g, 0, D, g)
            _Learner.outputs(case, g, (D,), g)
        _e_outputs(case)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        V = case.scalar("V")
        D, bv, w1 = case.const("D", "BLOCK_V", "W1_WORDS")
        if pid == cdiv(V, bv):
            for i, g in enumerate(("gain0_ptr", "gain1_ptr")):
                new = _Learner.update(case, g, case.data["dgain_ptr"][i], False)
                for name, want in zip("PMV", new):
                    yield g + name, (slice(0, D),), want
            return
        rows = _block(pid, bv, V)
        ids = case.data["ids_ptr"].astype(np.int64)
        want = np.zeros((rows.stop - rows.start, D), np.float32)
        hit = np.flatnonzero((ids >= rows.start) & (ids < rows.stop))    # increasing rows
        np.add.at(want, ids[hit] - rows.start, case.data["de_ptr"][hit])
        present = _present_rows(case, rows)
        new = [x.reshape(-1, D) for x in _Learner.update(case, f"E{pid}", want, True)]
        for r in present:
            for name, x in zip("PMV", new):
                yield "E" + name, (slice(int(r), int(r) + 1),), x[r - rows.start][None]
        yield from _row_words(case, rows, present, want)


def weight_grad_program(pid: int, tiles: list[int], programs: int) -> list[tuple[int, int]]:
    """The (product j, tile) pairs program pid runs, in order: tiles pid, pid + programs, … of
    the products' tiles numbered in turn (plan/kernels/weight_grad.py)."""
    out = []
    for t in range(pid, sum(tiles), programs):
        j = 0
        while t >= tiles[j]:
            t -= tiles[j]
            j += 1
        out.append((j, t))
    return out


@oracle("weight_grad")
class _WeightGrad:
    """Product tiles: g = bf(dy)ᵀ @ bf(x) (reference head/mlp/qkv backward's dW), then P, M, V of
    the tile by the reference learner (every matrix decays) and w16 = bf(p).  The sampled
    programs are those that own the products' corner and middle tiles (each program loops over
    tiles pid, pid + programs, …); only their tiles' row blocks of the planes are inputs."""

    def _dims(self, case):
        T, bm, bn = case.scalar("T"), *case.const("BLOCK_M", "BLOCK_N")
        dims = [case.scalar("M0", "N0"), case.scalar("M1", "N1")][:case.const("PRODUCTS")]
        return T, bm, bn, dims, [cdiv(M, bm) * cdiv(N, bn) for M, N in dims]

    def setup(self, case):
        T, bm, bn, dims, tiles = self._dims(case)
        n = case.launch.grid[0]
        if not 1 <= n <= sum(tiles):
            raise AssertionError(f"{case.launch.kernel}: grid {n} for {tiles} tiles")
        _Learner.start(case)
        g = case.const("GROUP_M")
        picks, base = [], 0
        for (M, N), t in zip(dims, tiles):
            tm, tn = cdiv(M, bm), cdiv(N, bn)
            corners = {matmul_pid(pm, pn, M, N, bm, bn, g) for pm, pn in
                       ((0, 0), (tm - 1, tn - 1), (0, tn - 1), (tm - 1, 0), (tm // 2, tn // 2))}
            picks += [(base + c) % n for c in corners]
            base += t
        case.hint = sorted(set(picks) | {n - 1})
        for j, (M, N) in enumerate(dims):
            case.input(f"a{j}_ptr", (T, M), scale=0.005)
            case.input(f"b{j}_ptr", (T, N), scale=0.005)
            _Learner.outputs(case, f"p{j}_ptr", (M, N), f"W{j}")
            case.output(f"h{j}_ptr", (M, N), T_ULP)
        for pid in case.hint:                    # the sampled programs' tiles' rows of P, M, V
            for j, tile in weight_grad_program(pid, tiles, n):
                M, N = dims[j]
                pm, _ = matmul_tile(tile, M, N, bm, bn, g)
                r = _block(pm, bm, M)
                key = f"W{j}rows{r.start}"
                if key + "P" not in case.data:
                    _Learner.planes(case, f"p{j}_ptr", r.start * N, (r.stop - r.start) * N, key)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        T, bm, bn, dims, tiles = self._dims(case)
        for j, tile in weight_grad_program(pid, tiles, case.launch.grid[0]):
            yield from self._tile(case, dims, j, tile, bm, bn)

    def _tile(self, case, dims, j, tile, bm, bn):
        M, N = dims[j]
        pm, pn = matmul_tile(tile, M, N, bm, bn, case.const("GROUP_M"))
        r, c = _block(pm, bm, M), _block(pn, bn, N)
        grad = ref.bf16(case.data[f"a{j}_ptr"][:, r]).T @ ref.bf16(case.data[f"b{j}_ptr"][:, c])
        key = f"W{j}rows{r.start}"
        d = case.data
        sub = {name: d[key + name].reshape(r.stop - r.start, N)[:, c] for name in "PMV"}
        case.data.update({f"{key}{c.start}{k}": v.reshape(-1) for k, v in sub.items()})
        P2, M2, V2 = _Learner.update(case, f"{key}{c.start}", grad, True)
        shape = (r.stop - r.start, c.stop - c.start)
        for name, want in zip("PMV", (P2, M2, V2)):
            yield f"W{j}{name}", (r, c), want.reshape(shape)
        yield f"h{j}_ptr", (r, c), ref.bf16(P2).reshape(shape)


@oracle("cross_entropy")
class _CrossEntropy:
    """ce (loss record and w0) and bf(dlogits): the reference cross_entropy(_backward) stages."""

    def setup(self, case):
        T, V, rows = case.scalar("T"), case.const("V"), case.const("ROWS")
        logits = case.input("logits_ptr", (T, V), scale=4.0)
        targets = case.rng.integers(0, V, T).astype(np.uint32)
        targets[0], targets[T - 1] = V - 1, 0
        case.input("targets_ptr", values=targets)
        case.cache["ce"] = ref.cross_entropy(logits, targets)
        case.cache["dl"] = ref.bf16(ref.cross_entropy_backward(logits, targets))
        case.output("loss_ptr", (T,), T_ELEM)
        case.output("w0_ptr", (T,), T_ELEM)
        case.output("dlogits_ptr", (T, V), T_ULP)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        rows = _block(pid, case.const("ROWS"), case.scalar("T"))
        yield "loss_ptr", (rows,), case.cache["ce"][rows]
        yield "w0_ptr", (rows,), case.cache["ce"][rows]
        yield "dlogits_ptr", (rows,), case.cache["dl"][rows]


@oracle("predictions")
class _Predictions:
    """pred[i] = {first index of the largest finite logit, all finite} of row ROW{i}."""

    def setup(self, case):
        V = case.const("V")
        rows = case.const("ROW0", "ROW1", "ROW2")
        for i, r in enumerate(rows):
            x = case.rng.standard_normal(V, dtype=np.float32)
            if i == 0:
                x[[7, 3000]] = 50.0                                   # a tie: the first index wins
            elif i == 1:
                x[11] = np.nan                                        # invalid row
                x[12] = 99.0
            else:
                x[V - 1] = 60.0                                       # the last column, past it masked
            case.input("logits_ptr", values=x, at=r * V, key=f"row{i}")
        case.output("pred_ptr", (len(rows), 2), EXACT)

    def programs(self, case):
        return list(range(case.launch.grid[0]))

    def expect(self, case, pid):
        x = case.data[f"row{pid}"]
        finite = np.isfinite(x)
        token = int(np.argmax(np.where(finite, x, -np.inf)))
        yield "pred_ptr", (pid,), np.array([token, int(finite.all())], np.uint32)


# ---------------------------------------------------------------- flat kernels

def _chunk(case, pid):
    n, blk = case.scalar("N"), case.const("BLOCK")
    return _block(pid, blk, n)


@oracle("copy_f32")
class _Copy:
    """dst[0:N] = src[0:N], bit for bit."""

    def setup(self, case):
        n = case.scalar("N")
        case.input("src_ptr", (n,))
        case.output("dst_ptr", (n,), EXACT)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        c = _chunk(case, pid)
        yield "dst_ptr", (c,), case.data["src_ptr"][c]


@oracle("cast_bf16")
class _Cast:
    """dst = bf(src): the reference bf16 (round to nearest even), bit for bit; only the sampled
    programs' chunks are written as inputs (N is 57.7 M)."""

    def setup(self, case):
        n = case.scalar("N")
        case.output("dst_ptr", (n,), EXACT)
        case.hint = sample(case.launch.grid[0])
        for pid in case.hint:
            c = _chunk(case, pid)
            case.input("src_ptr", (c.stop - c.start,), at=c.start, key=f"src{pid}")

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        yield "dst_ptr", (_chunk(case, pid),), ref.bf16(case.data[f"src{pid}"])


def _window_profile(profile, lo: int, hi: int):
    """The parameter table restricted to elements [lo, hi), renumbered from 0: what ref.adamw
    reads (parameter_count, parameters' offset/end/decay, learner), so the reference runs on one
    program's chunk instead of four 231 MB planes."""
    params = [types.SimpleNamespace(offset=max(p.offset, lo) - lo, end=min(p.end, hi) - lo,
                                    decay=p.decay)
              for p in profile.parameters if p.offset < hi and p.end > lo]
    return types.SimpleNamespace(parameter_count=hi - lo, parameters=params, learner=profile.learner)


@oracle("adamw")
class _AdamW:
    """P, M, V planes and the bf16 copy of one chunk: the reference learner's adamw on that chunk
    (t = t_base + doorbell); w16 is owned only outside the gains and E."""
    T_BASE, DOORBELL = 4998, 7

    def setup(self, case):
        n, blk = case.scalar("N"), case.const("BLOCK")
        c = dict(case.launch.constexprs)
        case.run_scalars["t_base"] = self.T_BASE
        case.input("doorbell_ptr", values=np.array([self.DOORBELL], np.uint32))
        edges = [c[k] for k in ("GAIN0_START", "GAIN0_END", "GAIN1_START", "GAIN1_END",
                                "EMBED_START", "EMBED_END")]
        # the programs holding each range edge (first and last element) and the plane's end
        case.hint = sample(case.launch.grid[0], *{min(e // blk, cdiv(n, blk) - 1) for e in edges},
                                *{(e - 1) // blk for e in edges if e > 0})
        for pid in case.hint:
            ch = _chunk(case, pid)
            m = ch.stop - ch.start
            P = 0.02 * case.rng.standard_normal(m, dtype=np.float32)
            Mo = 1e-3 * case.rng.standard_normal(m, dtype=np.float32)
            Vo = np.abs(1e-6 * case.rng.standard_normal(m, dtype=np.float32))
            G = 1e-3 * case.rng.standard_normal(m, dtype=np.float32)
            for plane, (key, vals) in enumerate((("P", P), ("M", Mo), ("V", Vo))):
                case.input("pmv_ptr", values=vals, at=plane * n + ch.start, key=f"{key}{pid}")
            case.input("grad_ptr", values=G, at=ch.start, key=f"G{pid}")
            case.watch("w16_ptr", (ch,))                              # the gains' and E's stay poison
        case.output("pmv_ptr", (3, n), T_ADAMW)
        case.output("w16_ptr", (n,), T_ULP)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        ch = _chunk(case, pid)
        c = dict(case.launch.constexprs)
        d = case.data
        prof = _window_profile(case.profile, ch.start, ch.stop)
        P2, M2, V2 = ref.adamw(prof, d[f"P{pid}"], d[f"M{pid}"], d[f"V{pid}"], d[f"G{pid}"],
                               self.T_BASE + self.DOORBELL)
        for plane, want in enumerate((P2, M2, V2)):
            yield "pmv_ptr", (plane, ch), want
        skip = sorted((c[a], c[b]) for a, b in (("GAIN0_START", "GAIN0_END"),
                                                ("GAIN1_START", "GAIN1_END"),
                                                ("EMBED_START", "EMBED_END")))
        start = ch.start                             # w16: the chunk less the skipped ranges
        for a, b in skip + [(ch.stop, ch.stop)]:
            a, b = min(max(a, ch.start), ch.stop), min(max(b, ch.start), ch.stop)
            if a > start:
                yield "w16_ptr", (slice(start, a),), ref.bf16(P2[start - ch.start:a - ch.start])
            start = max(start, b)
