"""The backend interface the run loop drives: staging memory, the P/M/V payload, three submissions.

Two backends implement it: `cuda` (host/backend_cuda.py, the production driver path) and
`interpret` (host/backend_interpret.py, the same launch lists run by Triton's interpreter on the CPU).
The run loop never knows which one it drives; base methods raise NotImplementedError.

Protocol for one issue (SPEC §7), shared by both backends:
  host writes the input record and the doorbell (sequence number) into staging,
  `issue(submission)` launches the instantiated submission (pre-launch release, kernels, final
  release), the host polls the mapped final-release payload in staging until it equals the sequence
  number, calling `check()` while it waits (raises DeviceError on a device fault).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError


class DeviceError(RuntimeError):
    """A device fault: the driver reported an error, or a submission misbehaved."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class BackendUnavailable(UserError):
    """The requested backend cannot run here (no driver, no GPU, no Triton)."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str                     # e.g. "NVIDIA H200" or "cpu (triton interpreter)"
    compute_capability: int       # 10·major + minor; 0 for the interpreter
    driver_version: int           # cuDriverGetVersion; 0 for the interpreter
    target: str                   # PTX target directory loaded ("sm_90a", "sm_80") or "interpret"


class Backend:
    name = "abstract"
    code = 0                      # staging.records.BACKEND_*

    # staging.views.StagingViews over the backend's staging region (mapped memory on cuda)
    staging = None

    def device(self) -> DeviceInfo:
        raise NotImplementedError

    @staticmethod
    def scalar_value(arg, t_base: int):
        """A launch's scalar argument: a constant, or a run scalar (`t_base`, NUMERICS.md)."""
        from plan import launches
        if isinstance(arg, launches.Scalar):
            return arg.value
        if isinstance(arg, launches.RunScalar):
            if arg.name != "t_base":
                raise ValueError(f"unknown run scalar {arg.name!r}")
            return int(t_base)
        raise TypeError(f"unknown launch argument {arg!r}")

    # ---- payload: P plane, M plane, V plane (fp32), one contiguous device buffer ----
    def upload_chunk(self, offset: int, nbytes: int) -> None:
        """Copy nbytes from the staging transfer window to payload bytes [offset, offset+nbytes)."""
        raise NotImplementedError

    def download_chunk(self, offset: int, nbytes: int) -> None:
        """Copy payload bytes [offset, offset+nbytes) into the staging transfer window."""
        raise NotImplementedError

    # ---- snapshot: publish a checkpoint while training goes on ----
    def snapshot(self) -> None:
        """Copy the payload (P, M, V) into a device-side snapshot, complete when this returns.

        Issued between two updates; later updates do not touch it, so a publisher thread can
        stream it out (`download_snapshot_chunk`) while the next steps run."""
        raise NotImplementedError

    def download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        """Like download_chunk, from the snapshot; may be called from another thread."""
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

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
