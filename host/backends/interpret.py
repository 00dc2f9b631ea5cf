"""The interpret backend: the plan's launch lists executed by Triton's interpreter on the CPU.

Device buffers are CPU torch tensors; staging is `coppelius.staging.views.allocate_host()` wrapped by
`StagingViews`, and kernels read and write it through torch views of that numpy buffer (no
copies).  The hand-written PTX launches (release, release_stage_in) are emulated in Python with
the host clock as device time.
This module sets TRITON_INTERPRET=1 (read when kernels are decorated, so it must run before any
coppelius.plan.kernels module is imported) and repairs Triton's interpreter once
(`coppelius.backends.interpreter_repairs`: bf16 rounding as the GPU's, tl.dot, tl.sum and the
elementary functions in an order and by definitions the project fixes, so the bits are the same on
every CPU; the kernels are never changed for it).
A submission's launches run one at a time in a topological order of its dependency graph
(plan/launches/graph.py): `prefer` picks which (SIDE_LANE: every side-lane launch as early as its
edges allow, the list order; MAIN_LANE: as late); every valid order gives the same bits, which a
test checks.
"""
from __future__ import annotations

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

from coppelius.plan import kernels as _kernels                        # noqa: E402
from coppelius.plan import launches as _launches                      # noqa: E402
from coppelius.plan.launches.graph import topological_order             # noqa: E402
from coppelius.staging import layout as L                            # noqa: E402
from coppelius.staging import records as R                     # noqa: E402
from coppelius.staging.views import StagingViews, allocate_host       # noqa: E402

from coppelius.backends import interpreter_repairs            # noqa: E402
from coppelius.backends.base import Backend, DeviceInfo      # noqa: E402
from coppelius.errors import DeviceError       # noqa: E402

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32,
                "u32": torch.int32}   # u32 staging words are viewed as int32 (ids, doorbell < 2³¹)


interpreter_repairs.apply()


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
