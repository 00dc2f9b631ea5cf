"""The interpret backend: the plan's launch lists executed by Triton's interpreter on the CPU.

Device buffers are CPU torch tensors; staging is `coppelius.staging.views.allocate_host()` wrapped by
`StagingViews`, and kernels read and write it through torch views of that numpy buffer (no
copies).  The hand-written PTX launches (release, release_stage_in) are emulated in Python with
the host clock as device time.
This module sets TRITON_INTERPRET=1 (read when kernels are decorated, so it must run before any
coppelius.plan.kernels module is imported) and repairs, once, two Triton 3.9 interpreter defects that would
make the interpreter disagree with the GPU (and skips its redundant re-patching of triton.language
at every device-function call, a fifth of an interpret run's time):
  * fp32 → bf16 conversion truncates (even with rounding "rtne"); the GPU rounds to nearest even;
  * tl.dot on bf16 operands multiplies their raw uint16 bits.
The repairs touch only the interpreter; kernels are never changed for it.
A submission's launches run one at a time in a topological order of its dependency graph
(plan/launches/graph.py): `prefer` picks which (SIDE_LANE: every side-lane launch as early as its
edges allow, the list order; MAIN_LANE: as late); every valid order gives the same bits, which a
test checks.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import os
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np                                          # noqa: E402
import torch                                                # noqa: E402
import triton.language as tl                                # noqa: E402
from triton.runtime import interpreter as _interp           # noqa: E402

from coppelius.plan import kernels as _kernels                        # noqa: E402
from coppelius.plan import launches as _launches                      # noqa: E402
from coppelius.plan.launches.graph import topological_order             # noqa: E402
from coppelius.plan.reference.numerics import bf16_bits, bf16_bits_to_f32   # noqa: E402
from coppelius.staging import layout as L                            # noqa: E402
from coppelius.staging import records as R                     # noqa: E402
from coppelius.staging.views import StagingViews, allocate_host       # noqa: E402

from coppelius.backends.base import Backend, DeviceInfo      # noqa: E402
from coppelius.errors import DeviceError       # noqa: E402

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32,
                "u32": torch.int32}   # u32 staging words are viewed as int32 (ids, doorbell < 2³¹)


def _patch_interpreter() -> None:
    if getattr(_interp, "_coppelius_patched", False):
        return
    convert = _interp._convert_float

    def convert_float(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode != _interp._ir.ROUNDING_MODE.RTZ:
            return bf16_bits(data)          # the reference's rounding, one definition
        if src == tl.bfloat16 and dst == tl.float32:
            return bf16_bits_to_f32(data)
        return convert(data, src, dst, rounding_mode)

    _interp._convert_float = convert_float
    create_dot = _interp.InterpreterBuilder.create_dot

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # bf16 × bf16 products are exact in fp32: upcasting first is exact, accumulation is fp32.
        # np.matmul with a dtype= argument skips BLAS (22 ms for a 256×32×256 tile): call it plain.
        if a.dtype.scalar == tl.bfloat16 and b.dtype.scalar == tl.bfloat16 \
                and d.data.dtype == np.float32:
            acc = np.matmul(bf16_bits_to_f32(a.data), bf16_bits_to_f32(b.data))
            acc += d.data
            return _interp.TensorHandle(acc, d.dtype.scalar)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    _interp.InterpreterBuilder.create_dot = dot
    _skip_nested_language_patches()
    _interp._coppelius_patched = True


def _skip_nested_language_patches() -> None:
    """Triton 3.9's interpreter patches triton.language again at every device-function call
    (`inspect.getmembers` over tl, tl.tensor, tl.math) into a scope it never restores: 15,086
    patches in a one-step tiny run, 16 s of its 70 s (cProfile).  Inside a launch the launch's
    own patch already holds for its modules, and a nested one would set the same fn-independent
    wrappers, so a device function whose language modules the running launch has patched (tl;
    tl.core once triton.language's own helpers, cdiv, zeros, sum, have been called) skips it; any
    other call takes Triton's path.  The bits cannot change: the same
    wrappers run either way (the interpret golden is compared bit for bit)."""
    patch_lang, run_grid = _interp._patch_lang, _interp.GridExecutor.__call__
    launches: list[dict] = []               # the running launch: its modules, whether patched

    def languages(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def maybe_patch_lang(fn):
        launch = launches[-1] if launches else None
        if launch is not None and launch["patched"] and languages(fn) <= launch["languages"]:
            return _interp._LangPatchScope()        # nothing to restore
        scope = patch_lang(fn)
        if launch is not None:                      # the launch's own patch comes first; then
            launch["patched"] = True                # tl.core, for triton.language's helpers
            launch["languages"] |= languages(fn)
        return scope

    def grid_call(self, *args, **kwargs):
        launches.append({"languages": languages(self.fn), "patched": False})
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launches.pop()

    _interp._patch_lang = maybe_patch_lang
    _interp.GridExecutor.__call__ = grid_call


_patch_interpreter()


def _openblas():
    """(get, set) thread-count functions of the OpenBLAS numpy loaded, or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    return get, put
    return None


_BLAS = _openblas()


@contextlib.contextmanager
def single_thread_blas():
    """Interpreter tiles are small (≤ 256×256): BLAS worker threads only spin.  Measured on the
    2-core CI machine, one tiny update step: 22 s CPU with 2 BLAS threads, 6 s with 1."""
    if _BLAS is None:
        yield
        return
    get, put = _BLAS
    before = get()
    put(1)
    try:
        yield
    finally:
        put(before)


def kernel_function(launch):
    """The interpreted Triton function a launch names."""
    return getattr(importlib.import_module(launch.module), launch.function)


@dataclass(frozen=True)
class Step:
    """One launch of an instantiated submission, its arguments resolved: a Triton kernel run by
    the interpreter on its grid, or (`emulate` set) a hand-written PTX launch run in Python."""
    args: list
    kernel: object = None                        # the interpreted Triton function
    grid: tuple[int, int, int] = (1, 1, 1)
    constexprs: dict = field(default_factory=dict)
    emulate: Callable | None = None              # the backend method that stands for the PTX

    def run(self) -> None:
        if self.emulate is not None:
            self.emulate(*self.args)
            return
        try:
            self.kernel[self.grid](*self.args, **self.constexprs)
        except Exception as exc:                 # a kernel fault
            raise DeviceError(f"interpreter: {self.kernel.__name__}: {exc}") from exc


class InterpretBackend(Backend):
    name = "interpret"
    code = R.BACKEND_INTERPRET

    def __init__(self, profile, prefer: int = _launches.SIDE_LANE):
        super().__init__(profile)
        if prefer not in _launches.LANES:
            raise ValueError(f"prefer = {prefer}: one of the lanes {_launches.LANES}")
        self.prefer = prefer
        self._host = allocate_host()
        self.staging = StagingViews(self._host, profile)
        self._staging_bytes = torch.from_numpy(self._host)              # aliases staging
        self.allocate_buffers()
        self._payload = self.buffers["pmv"].view(-1).view(torch.uint8)  # (payload_bytes,)
        self._submissions = _launches.submissions(profile)
        self._plans = None

    def device(self) -> DeviceInfo:
        return DeviceInfo("cpu (triton interpreter)", 0, 0, "interpret")

    def _alloc(self, spec, fill: int) -> torch.Tensor:
        t = torch.empty(spec.nbytes, dtype=torch.uint8)
        t.fill_(fill)
        return t.view(TORCH_DTYPES[spec.dtype]).view(spec.shape)

    # ---- payload through the transfer window (bounds checked by the base)
    def _window(self, nbytes: int) -> torch.Tensor:
        return self._staging_bytes[L.TRANSFER_WINDOW:L.TRANSFER_WINDOW + nbytes]

    def _upload_chunk(self, offset: int, nbytes: int) -> None:
        self._payload[offset:offset + nbytes].copy_(self._window(nbytes))

    def _download_chunk(self, offset: int, nbytes: int) -> None:
        self._window(nbytes).copy_(self._payload[offset:offset + nbytes])

    def snapshot(self) -> None:
        self._snapshot = self._payload.clone()

    def _download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        self._window(nbytes).copy_(self._snapshot[offset:offset + nbytes])

    # ---- launch arguments (scalars resolved by the base)
    def _buffer_arg(self, ref) -> torch.Tensor:
        return self.buffers[ref.buffer].view(-1)[ref.offset:]

    def _staging_arg(self, ref) -> torch.Tensor:
        size = TORCH_DTYPES[ref.dtype].itemsize
        end = L.REGION_BYTES - (L.REGION_BYTES - ref.offset) % size
        return self._staging_bytes[ref.offset:end].view(TORCH_DTYPES[ref.dtype])

    def instantiate(self, t_base: int) -> None:
        plans = []
        for sub in self._submissions:
            plans.append([self._step(sub.launches[i], t_base)
                          for i in topological_order(sub.launches, sub.deps, self.prefer)])
        self._plans = plans
        self._t_base = t_base                   # run_launch makes a launch's step anew

    def _step(self, launch, t_base: int) -> Step:
        args = [self.resolve(a, t_base) for _, a in launch.args]
        if launch.function in _launches.HAND_WRITTEN:
            return Step(args, emulate=getattr(self, "_" + launch.function))
        return Step(args, kernel_function(launch), launch.grid, dict(launch.constexprs))

    def _release(self, doorbell: torch.Tensor, slot: torch.Tensor) -> None:
        words = slot[:4]                                             # int32 view of the record
        words.view(torch.int64)[1] = time.time_ns()                  # timestamp before the payload
        words[1] = 0
        words[0] = int(doorbell[0])

    def _release_stage_in(self, doorbell, slot, record, staged) -> None:
        """release_stage_in.ptx: the input record and the doorbell into `staged`, then the
        pre-launch release."""
        n = L.INPUT_RECORD_BYTES // 4
        staged[:n] = record[:n]
        staged[n] = doorbell[0]
        self._release(doorbell, slot)

    def issue(self, submission: int) -> None:
        if self._plans is None:
            raise DeviceError("issue before instantiate")
        with single_thread_blas():
            for step in self._plans[submission]:
                step.run()

    def check(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    # ---- per-launch digests (host/run/digest_replay.py): one launch alone, bytes in and out
    def run_launch(self, submission: int, index: int) -> None:
        if self._plans is None:
            raise DeviceError("run_launch before instantiate")
        with single_thread_blas():
            self._step(self._submissions[submission].launches[index], self._t_base).run()

    def code_sha256(self, launch) -> str:
        """The Triton source the interpreter runs (the hand-written PTX it emulates)."""
        if launch.function in _launches.HAND_WRITTEN:
            path = Path(_kernels.__file__).resolve().parent / f"{launch.function}.ptx"
        else:
            path = Path(importlib.import_module(launch.module).__file__)
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def _bytes(self, name: str) -> torch.Tensor:
        return self.buffers[name].view(-1).view(torch.uint8)

    def _read_buffer(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        return self._bytes(name)[offset:offset + nbytes].numpy().copy()

    def _write_buffer(self, name: str, offset: int, data: np.ndarray) -> None:
        self._bytes(name)[offset:offset + data.size] = torch.from_numpy(data)

    def save_buffers(self) -> dict:
        return {name: t.clone() for name, t in self.buffers.items()}

    def restore_buffers(self, saved: dict) -> None:
        for name, t in saved.items():
            self.buffers[name].copy_(t)

    def free_saved(self, saved: dict) -> None:
        saved.clear()
