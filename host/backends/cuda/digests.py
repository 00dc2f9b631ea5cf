"""The cuda backend's primitives for the per-launch digests (host/run/digest_replay.py walks).

One launch of an instantiated submission alone: its packed parameters from the capture
(`Capture.params`, the very ones the graph holds), launched on the submission stream outside the
graph and synchronized.  Device bytes move through a pinned mapped buffer of the transfer window's
size made on first use — not the transfer window itself, which a publication may be streaming
through — in window-sized chunks; the buffers are saved and restored by device-to-device copies.
"""
from __future__ import annotations

import numpy as np

from coppelius.staging import layout as L

from coppelius.backends.base import window_chunks
from coppelius.driver.device import (DeviceBuffer, MappedRegion, memcpy_dtod, memcpy_dtoh,
                                     memcpy_htod)


class LaunchDigests:
    """The digests' primitives (CudaBackend.digests).  It is handed the device (its submission
    stream), the backend's device buffers by name, the capture (its packed launches), the
    manifest (the loaded PTX files' digests) and the backend's closers (the bounce buffer is freed
    with the rest)."""

    def __init__(self, device, buffers: dict, capture, manifest, closers):
        self.dev, self.buffers, self.capture = device, buffers, capture
        self.manifest, self.closers = manifest, closers
        self._bounce: MappedRegion | None = None

    def run_launch(self, submission: int, index: int) -> None:
        kernel, params, grid = self.capture.params[submission][index]
        kernel.launch(self.dev.stream, grid, params)
        self.dev.synchronize()
        self.dev.query()            # raises on a device fault

    def code_sha256(self, launch) -> str:
        """The loaded PTX file's digest (its manifest's, checked when it was loaded)."""
        return self.manifest.entries[launch.kernel].sha256

    def _bounce_region(self) -> MappedRegion:
        if self._bounce is None:
            self._bounce = MappedRegion(L.TRANSFER_WINDOW_BYTES)
            self.closers.append(self._bounce)
        return self._bounce

    def read_buffer(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        bounce, base = self._bounce_region(), self.buffers[name].ptr + offset
        for at, n in window_chunks(nbytes):
            memcpy_dtoh(bounce.host_ptr, base + at, n, self.dev.stream)
            self.dev.synchronize()
            out[at:at + n] = bounce.array[:n]
        return out

    def write_buffer(self, name: str, offset: int, data: np.ndarray) -> None:
        bounce, base = self._bounce_region(), self.buffers[name].ptr + offset
        for at, n in window_chunks(data.size):
            bounce.array[:n] = data[at:at + n]
            memcpy_htod(base + at, bounce.host_ptr, n, self.dev.stream)
            self.dev.synchronize()

    def save_buffers(self) -> dict:
        saved = {}
        try:
            for name, b in self.buffers.items():
                saved[name] = DeviceBuffer(b.nbytes)
                memcpy_dtod(saved[name].ptr, b.ptr, b.nbytes, self.dev.stream)
            self.dev.synchronize()
        except BaseException:
            self.free_saved(saved)
            raise
        return saved

    def restore_buffers(self, saved: dict) -> None:
        for name, copy in saved.items():
            memcpy_dtod(self.buffers[name].ptr, copy.ptr, copy.nbytes, self.dev.stream)
        self.dev.synchronize()

    @staticmethod
    def free_saved(saved: dict) -> None:
        for copy in saved.values():
            copy.close()
        saved.clear()
