"""One production launch under test: its arguments resolved onto full-size memory, the inputs its
registry entry writes, the outputs it declares, and the sampled programs run in the interpreter
(production/checks.py poisons the watched memory and judges what the programs wrote)."""
from __future__ import annotations

import importlib
import math
import time
import zlib

import numpy as np
import torch
from tests.support.kernels_support import bf16_bits, bf16_values

from coppelius.backends.base import BUFFER_POISON  # device buffers: NaN for floats, -1 for ints
from coppelius.backends.interpret import TORCH_DTYPES
from coppelius.plan import launches
from coppelius.staging import layout as L

from tests.support.production.memory import NP_DTYPES, Output, Space
from tests.support.production.programs import run_programs


class Case:
    """One launch's inputs, outputs, sampled programs and checks (production/__init__.py says how)."""

    def __init__(self, launch, specs, profile=None, seed: int | None = None):
        self.launch = launch
        self.specs = specs                          # buffer name → coppelius.plan.buffers.BufferSpec
        self.profile = profile
        self.rng = np.random.default_rng(zlib.crc32(launch.kernel.encode()) if seed is None else seed)
        self.spaces: dict[str, Space] = {}
        self.outputs: dict[str, Output] = {}
        self.data: dict[str, np.ndarray] = {}       # what setup wrote, as the kernel reads it
        self.run_scalars: dict[str, int] = {}       # RunScalar values (t_base)
        self.cache: dict = {}                       # oracle intermediates shared by programs
        self.claims: list[tuple[str, object, np.ndarray, object]] = []   # (output, index, want, pid)
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

    def space(self, arg) -> Space:
        """The memory a pointer argument points into (created, poisoned if staging, on first use)."""
        if isinstance(arg, launches.StagingRef):
            key, nbytes, poison, spec = "staging", L.REGION_BYTES, L.POISON_BYTE, None
        elif isinstance(arg, launches.BufferRef):
            spec = self.specs[arg.buffer]
            key, nbytes, poison = arg.buffer, spec.nbytes, BUFFER_POISON
        else:
            raise TypeError(f"{self.launch.kernel}: {arg} is not a pointer argument")
        if key not in self.spaces:
            s = Space(key, nbytes, poison, spec)
            if key == "staging":
                s.bytes[:] = L.POISON_BYTE         # a fresh staging region is poisoned whole
            self.spaces[key] = s
        return self.spaces[key]

    def _locate_arg(self, arg, at: int = 0):
        """(space, absolute byte offset, dtype) of element `at` of a pointer argument."""
        space = self.space(arg)
        start = space.base + (arg.offset if isinstance(arg, launches.StagingRef) else arg.byte_offset)
        return space, start + at * launches.DTYPE_BYTES[arg.dtype], arg.dtype

    def _locate(self, name: str, at: int = 0):
        return self._locate_arg(self.launch.arg(name), at)

    def region(self, name: str, shape, at: int = 0) -> np.ndarray:
        """The raw typed view (bf16 as uint16 bits) of `shape` elements at argument `name`."""
        space, start, dtype = self._locate(name, at)
        n = math.prod(shape) * launches.DTYPE_BYTES[dtype]
        if start + n > space.total:
            raise ValueError(f"{self.launch.kernel}: {name} region {shape} runs past {space.name}")
        return space.bytes[start:start + n].view(NP_DTYPES[dtype]).reshape(shape)

    def values(self, out: Output, index) -> np.ndarray:
        """What the programs left in `index` of output `out` (bf16 as its fp32 values)."""
        raw = self.region(out.arg, out.shape, out.at)[index]
        return bf16_values(raw) if out.dtype == "bf16" else raw

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

    def output(self, name: str, shape, tol, at: int = 0, key: str | None = None) -> None:
        """Declare the output region `shape` at argument `name` (+ `at` elements), owned and
        checked as `key` (default: the argument's name; one pointer may lead to several
        outputs, e.g. the P, M and V planes of a parameter) within `tol` (a harness.Tol)."""
        space, start, dtype = self._locate(name, at)
        self.outputs[key or name] = Output(name, tuple(shape), tol, space, start, dtype, at)

    # -- running
    def resolve(self, arg):
        """The launch argument as the kernel receives it: a torch view from the pointer on."""
        if isinstance(arg, (launches.BufferRef, launches.StagingRef)):
            space, start, dtype = self._locate_arg(arg)
            item = launches.DTYPE_BYTES[dtype]
            stop = start + (space.total - start) // item * item
            return torch.from_numpy(space.bytes[start:stop]).view(TORCH_DTYPES[dtype])
        if isinstance(arg, launches.Scalar):
            return arg.value
        if isinstance(arg, launches.RunScalar):
            if arg.name not in self.run_scalars:
                raise KeyError(f"{self.launch.kernel}: setup gave no value for run scalar {arg.name!r}")
            return self.run_scalars[arg.name]
        raise TypeError(f"{self.launch.kernel}: unknown argument kind {arg!r}")

    def run(self) -> float:
        """Run the sampled programs; the interpreter's seconds."""
        fn = getattr(importlib.import_module(self.launch.module), self.launch.function)
        args = [self.resolve(a) for _, a in self.launch.args]
        t0 = time.perf_counter()
        run_programs(fn, self.launch.grid, self.pids, args, dict(self.launch.constexprs),
                     self.launch.num_warps, self.launch.num_stages)
        return time.perf_counter() - t0
