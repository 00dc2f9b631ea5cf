"""The cuda backend's primitives for the per-launch digests (host/digest_replay.py walks).

One launch of an instantiated submission alone: its packed parameters from the capture
(`_params`, the very ones the graph holds), launched on the submission stream outside the graph and
synchronized.  Device bytes move through a pinned mapped buffer of the transfer window's size made
on first use — not the transfer window itself, which a publication may be streaming through — in
window-sized chunks; the buffers are saved and restored by device-to-device copies.
"""
from __future__ import annotations

import numpy as np

from staging import layout as SL

from .backend import window_chunks
from .driver_device import DeviceBuffer, MappedRegion, memcpy_dtod, memcpy_dtoh, memcpy_htod


class CudaDigests:
    """A mixin of CudaBackend: it uses `dev`, `buffers`, `manifest`, `_params` and `_closers`."""

    _bounce: MappedRegion | None = None

    def run_launch(self, submission: int, index: int) -> None:
        kernel, params, grid = self._params[submission][index]
        kernel.launch(self.dev.stream, grid, params)
        self.dev.synchronize()
        self.check()

    def code_sha256(self, launch) -> str:
        """The loaded PTX file's digest (its manifest's, checked when it was loaded)."""
        return self.manifest.entries[launch.kernel].sha256

    def _bounce_region(self) -> MappedRegion:
        if self._bounce is None:
            self._bounce = MappedRegion(SL.TRANSFER_WINDOW_BYTES)
            self._closers.append(self._bounce)
        return self._bounce

    def _read_buffer(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        bounce, base = self._bounce_region(), self.buffers[name].ptr + offset
        for at, n in window_chunks(nbytes):
            memcpy_dtoh(bounce.host_ptr, base + at, n, self.dev.stream)
            self.dev.synchronize()
            out[at:at + n] = bounce.array[:n]
        return out

    def _write_buffer(self, name: str, offset: int, data: np.ndarray) -> None:
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

    def free_saved(self, saved: dict) -> None:
        for copy in saved.values():
            copy.close()
        saved.clear()
