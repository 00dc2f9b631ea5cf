"""The backend interface the run loop drives: staging memory, the P/M/V payload, three submissions.

Two backends implement it: `cuda` (host/backends/cuda/backend.py, the production driver path) and
`interpret` (host/backends/interpret.py, the same launch lists run by Triton's interpreter on the CPU).
The run loop never knows which one it drives.  The base owns the shared rules (the transfer
window's chunk bounds, the device-buffer poison, launch-argument resolution); a backend writes only
its primitives (`_upload_chunk`, `_buffer_arg`, ...), which raise NotImplementedError here.

Protocol for one issue (CONTRACT §7), shared by both backends:
  host writes the input record and the doorbell (sequence number) into staging,
  `issue(submission)` launches the instantiated submission (pre-launch release, kernels, final
  release), the host polls the mapped final-release payload in staging until it equals the sequence
  number, calling `check()` while it waits (raises DeviceError on a device fault).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coppelius.plan import launches
from coppelius.plan.buffers import buffers as plan_buffers
from coppelius.plan.launches.regions import STAGING
from coppelius.staging import layout as L

BUFFER_POISON = 0xFF            # every device buffer starts as NaN bytes: an unwritten read shows


def window_chunks(nbytes: int):
    """(offset, size) of each transfer-window chunk covering bytes [0, nbytes), in order."""
    for offset in range(0, nbytes, L.TRANSFER_WINDOW_BYTES):
        yield offset, min(L.TRANSFER_WINDOW_BYTES, nbytes - offset)


@dataclass(frozen=True)
class DeviceInfo:
    name: str                     # e.g. "NVIDIA H200" or "cpu (triton interpreter)"
    compute_capability: int       # 10·major + minor; 0 for the interpreter
    driver_version: int           # cuDriverGetVersion; 0 for the interpreter
    target: str                   # PTX target directory loaded ("sm_90a", "sm_80") or "interpret"


class Backend:
    name = "abstract"
    code = 0                      # coppelius.staging.records.BACKEND_*

    # coppelius.staging.views.StagingViews over the backend's staging region (mapped memory on cuda)
    staging = None

    def __init__(self, profile):
        self.profile = profile
        self.buffers: dict = {}   # plan/buffers.py name -> the backend's device buffer

    def allocate_buffers(self) -> None:
        """Every device buffer of plan/buffers.py, filled with BUFFER_POISON, complete on return."""
        for name, spec in plan_buffers(self.profile).items():
            self.buffers[name] = self._alloc(spec, BUFFER_POISON)
        self.synchronize()

    def _alloc(self, spec, fill: int):
        """One device buffer of `spec.nbytes`, every byte set to `fill` (may complete later)."""
        raise NotImplementedError

    def device(self) -> DeviceInfo:
        raise NotImplementedError

    def gpu_identity(self):
        """The GPU's ordinal, UUID and PCI bus id (coppelius.driver.device.GpuIdentity); None
        where no GPU runs the plan (the interpreter)."""
        return None

    # ---- launch arguments: device buffers and staging by the backend, scalars here
    def resolve(self, arg, t_base: int):
        """A launch argument as the backend passes it: a buffer or staging address, or a scalar
        (a constant, or a run scalar: `t_base`, NUMERICS.md)."""
        if isinstance(arg, launches.BufferRef):
            return self._buffer_arg(arg)
        if isinstance(arg, launches.StagingRef):
            return self._staging_arg(arg)
        if isinstance(arg, launches.Scalar):
            return arg.value
        if isinstance(arg, launches.RunScalar):
            if arg.name != "t_base":
                raise ValueError(f"unknown run scalar {arg.name!r}")
            return int(t_base)
        raise TypeError(f"unknown launch argument {arg!r}")

    def _buffer_arg(self, ref):
        raise NotImplementedError

    def _staging_arg(self, ref):
        raise NotImplementedError

    # ---- payload: P plane, M plane, V plane (fp32), one contiguous device buffer ----
    def check_chunk(self, offset: int, nbytes: int) -> None:
        """A chunk must lie inside the payload and fit the transfer window."""
        total = self.profile.payload_bytes
        if nbytes > L.TRANSFER_WINDOW_BYTES or offset < 0 or offset + nbytes > total:
            raise ValueError(f"chunk [{offset}, {offset + nbytes}) outside the payload ({total} "
                             "bytes) or larger than the transfer window")

    def upload_chunk(self, offset: int, nbytes: int) -> None:
        """Copy nbytes from the staging transfer window to payload bytes [offset, offset+nbytes)."""
        self.check_chunk(offset, nbytes)
        self._upload_chunk(offset, nbytes)

    def download_chunk(self, offset: int, nbytes: int) -> None:
        """Copy payload bytes [offset, offset+nbytes) into the staging transfer window."""
        self.check_chunk(offset, nbytes)
        self._download_chunk(offset, nbytes)

    def upload_payload(self, data: np.ndarray) -> None:
        """The whole payload through the transfer window: `data` (uint8) first, zeros after it."""
        transfer = self.staging.transfer
        for offset, n in window_chunks(self.profile.payload_bytes):
            k = min(n, max(0, data.size - offset))                   # bytes of data in this chunk
            transfer[:k] = data[offset:offset + k]
            transfer[k:n] = 0
            self.upload_chunk(offset, n)

    def _upload_chunk(self, offset: int, nbytes: int) -> None:
        raise NotImplementedError

    def _download_chunk(self, offset: int, nbytes: int) -> None:
        raise NotImplementedError

    # ---- snapshot: publish a checkpoint while training goes on ----
    def snapshot(self) -> None:
        """Copy the payload (P, M, V) into a device-side snapshot, complete when this returns.

        Issued between two updates; later updates do not touch it, so a publisher thread can
        stream it out (`download_snapshot_chunk`) while the next steps run."""
        raise NotImplementedError

    def download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        """Like download_chunk, from the snapshot; may be called from another thread."""
        self.check_chunk(offset, nbytes)
        self._download_snapshot_chunk(offset, nbytes)

    def _download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        raise NotImplementedError

    # ---- per-launch digests: host/run/digest_replay.py walks the launches and summarizes the
    # regions; a backend runs one launch alone and moves bytes (`_read_buffer`, ...)
    def plan_submission(self, index: int):
        """The plan's launch list of submission `index`, as this backend instantiates it."""
        return self._submissions[index]

    def plan_buffers(self) -> dict:
        return plan_buffers(self.profile)

    def read_region(self, region) -> np.ndarray:
        """A plan/launches/regions.py Region's runs, concatenated in order, as bytes."""
        start, nbytes = region.byte_span()
        raw = self.read_bytes(region.space, start, nbytes)
        if region.repeat == 1:
            return raw
        size = region.itemsize
        return np.concatenate([raw[k * region.stride * size:(k * region.stride + region.run) * size]
                               for k in range(region.repeat)])

    def read_bytes(self, space: str, offset: int, nbytes: int) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of a device buffer, or of staging (space "staging")."""
        if space == STAGING:
            return self.staging.raw[offset:offset + nbytes].copy()
        self._check_span(space, offset, nbytes)
        return self._read_buffer(space, offset, nbytes)

    def write_bytes(self, space: str, offset: int, data: np.ndarray) -> None:
        """`data` (uint8) into a device buffer or staging from byte `offset` (tests and tools)."""
        if space == STAGING:
            self.staging.raw[offset:offset + data.size] = data
            return
        self._check_span(space, offset, data.size)
        self._write_buffer(space, offset, np.ascontiguousarray(data, np.uint8))

    def _check_span(self, space: str, offset: int, nbytes: int) -> None:
        spec = plan_buffers(self.profile).get(space)
        if spec is None or offset < 0 or offset + nbytes > spec.nbytes:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) outside device buffer {space!r}")

    def run_launch(self, submission: int, index: int) -> None:
        """Launch `index` of an instantiated submission by itself, complete on return."""
        raise NotImplementedError

    def code_sha256(self, launch) -> str:
        """The digest of the code that runs `launch` on this backend."""
        raise NotImplementedError

    def save_buffers(self):
        """A copy of every device buffer, complete on return (restore_buffers, free_saved)."""
        raise NotImplementedError

    def restore_buffers(self, saved) -> None:
        raise NotImplementedError

    def free_saved(self, saved) -> None:
        raise NotImplementedError

    def _read_buffer(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    def _write_buffer(self, name: str, offset: int, data: np.ndarray) -> None:
        raise NotImplementedError

    # ---- submissions ----
    def instantiate(self, t_base: int) -> None:
        """Build the three plan submissions once (CUDA graphs on cuda); t_base per NUMERICS.md."""
        raise NotImplementedError

    def issue(self, submission: int) -> None:
        """Launch one instantiated submission; returns without waiting on cuda."""
        raise NotImplementedError

    def check(self) -> bool | None:
        """Raise DeviceError if the device has reported an error (called while polling a fence).

        May return True when all issued work has finished (the stream is idle): the ring then knows
        a fence that has not arrived never will.  None means "not known"."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def abandon(self, reason: str) -> None:
        """Something may still touch the backend's memory (a thread, the device): close() must
        free nothing.  Host memory is garbage-collected, so only the cuda backend acts on it."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
