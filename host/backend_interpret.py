"""The interpret backend: the plan's launch lists executed by Triton's interpreter on the CPU.

Device buffers are CPU torch tensors; staging is `staging.views.allocate_host()` wrapped by
`StagingViews`, and kernels read and write it through torch views of that numpy buffer (no
copies).  The hand-written PTX launches (release, release_stage_in) are emulated in Python with
the host clock as device time.
This module sets TRITON_INTERPRET=1 (read when kernels are decorated, so it must run before any
plan.kernels module is imported) and repairs, once, two Triton 3.9 interpreter defects that would
make the interpreter disagree with the GPU:
  * fp32 → bf16 conversion truncates (even with rounding "rtne"); the GPU rounds to nearest even;
  * tl.dot on bf16 operands multiplies their raw uint16 bits.
The repairs touch only the interpreter; kernels are never changed for it.
A submission's launches run one at a time in a topological order of its dependency graph
(plan/launch_graph.py): `prefer` picks which (SIDE_LANE: every side-lane launch as early as its
edges allow, the list order; MAIN_LANE: as late); every valid order gives the same bits, which a
test checks.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np                                          # noqa: E402
import torch                                                # noqa: E402
import triton.language as tl                                # noqa: E402
from triton.runtime import interpreter as _interp           # noqa: E402

from plan import launches as _launches                      # noqa: E402
from plan.launch_graph import topological_order             # noqa: E402
from staging import layout as SL                            # noqa: E402
from staging import records as _records                     # noqa: E402
from staging.views import StagingViews, allocate_host       # noqa: E402

from .backend import Backend, DeviceError, DeviceInfo       # noqa: E402

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32,
                "u32": torch.int32}   # u32 staging words are viewed as int32 (ids, doorbell < 2³¹)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 → bf16 bit patterns, round to nearest even; NaN stays a quiet NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x0040), r)
    return r.astype(np.uint16)


def _bf16_bits_to_f32(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _patch_interpreter() -> None:
    if getattr(_interp, "_coppelius_patched", False):
        return
    convert = _interp._convert_float

    def convert_float(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode != _interp._ir.ROUNDING_MODE.RTZ:
            return _f32_to_bf16_bits(data)
        if src == tl.bfloat16 and dst == tl.float32:
            return _bf16_bits_to_f32(data)
        return convert(data, src, dst, rounding_mode)

    _interp._convert_float = convert_float
    create_dot = _interp.InterpreterBuilder.create_dot

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # bf16 × bf16 products are exact in fp32: upcasting first is exact, accumulation is fp32.
        # np.matmul with a dtype= argument skips BLAS (22 ms for a 256×32×256 tile): call it plain.
        if a.dtype.scalar == tl.bfloat16 and b.dtype.scalar == tl.bfloat16 \
                and d.data.dtype == np.float32:
            acc = np.matmul(_bf16_bits_to_f32(a.data), _bf16_bits_to_f32(b.data))
            acc += d.data
            return _interp.TensorHandle(acc, d.dtype.scalar)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    _interp.InterpreterBuilder.create_dot = dot
    _interp._coppelius_patched = True


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


class InterpretBackend(Backend):
    name = "interpret"
    code = _records.BACKEND_INTERPRET

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
        return self._staging_bytes[SL.TRANSFER_WINDOW:SL.TRANSFER_WINDOW + nbytes]

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
        end = SL.REGION_BYTES - (SL.REGION_BYTES - ref.offset) % size
        return self._staging_bytes[ref.offset:end].view(TORCH_DTYPES[ref.dtype])

    def instantiate(self, t_base: int) -> None:
        plans = []
        for sub in self._submissions:
            steps = []
            for i in topological_order(sub.launches, sub.deps, self.prefer):
                launch = sub.launches[i]
                args = [self.resolve(a, t_base) for _, a in launch.args]
                if launch.function in _launches.HAND_WRITTEN:
                    steps.append((None, launch.function, args, {}))
                else:
                    steps.append((kernel_function(launch), launch.grid, args, dict(launch.constexprs)))
            plans.append(steps)
        self._plans = plans

    def _release(self, doorbell: torch.Tensor, slot: torch.Tensor) -> None:
        words = slot[:4]                                             # int32 view of the record
        words.view(torch.int64)[1] = time.time_ns()                  # timestamp before the payload
        words[1] = 0
        words[0] = int(doorbell[0])

    def _release_stage_in(self, doorbell, slot, record, staged) -> None:
        """release_stage_in.ptx: the input record and the doorbell into `staged`, then the
        pre-launch release."""
        n = SL.INPUT_RECORD_BYTES // 4
        staged[:n] = record[:n]
        staged[n] = doorbell[0]
        self._release(doorbell, slot)

    def issue(self, submission: int) -> None:
        if self._plans is None:
            raise DeviceError("issue before instantiate")
        with single_thread_blas():
            for fn, grid, args, constexprs in self._plans[submission]:
                if fn is None:                                       # hand-written PTX, emulated
                    getattr(self, "_" + grid)(*args)
                    continue
                try:
                    fn[grid](*args, **constexprs)
                except Exception as exc:                             # a kernel fault
                    raise DeviceError(f"interpreter: {fn.__name__}: {exc}") from exc

    def check(self) -> None:
        pass

    def synchronize(self) -> None:
        pass
