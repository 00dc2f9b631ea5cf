"""Checkpoint publication on a thread: a device-side snapshot streamed out while training goes on."""
from __future__ import annotations

import threading
import time

from coppelius import checkpoints as ckpt


class Publisher:
    """Publishes checkpoints from a device-side snapshot on a thread while training goes on.

    `start(n)` waits for the publication in flight, snapshots the payload on the device (between
    two updates, ~0.25 ms for 692 MB on an H200), and streams the snapshot through the transfer
    window on a thread; the step loop keeps issuing updates meanwhile.  `wait()` joins it and
    re-raises its error.  Publishing is ~2 s per 692 MB checkpoint on the 2-core CI machine
    (docs/PERFORMANCE.md): ten of them would otherwise stop the GPU for longer than the
    10,000 steps take.

    `on_published(update_count)`, when given, is called on the thread once a publication has
    completed (the run's telemetry sample: NVML calls take milliseconds, which the step loop
    must not wait for).
    """

    def __init__(self, backend, ckpt_path, profile, summary, progress, on_published=None):
        self.backend, self.path, self.profile = backend, ckpt_path, profile
        self.summary, self.progress = summary, progress
        self.on_published = on_published
        self.transfer = backend.staging.transfer
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.sha256 = bytes(32)              # of the last published file (the status block's)
        self.update_count: int | None = None  # of the last publication started
        self.published: int | None = None     # update count of the last one completed

    def start(self, update_count: int) -> None:
        self.wait()
        self.backend.snapshot()
        self.update_count = update_count
        self.thread = threading.Thread(target=self._publish, args=(update_count,),
                                       name=f"publish-{update_count}", daemon=True)
        self.thread.start()

    def _publish(self, update_count: int) -> None:
        t = time.monotonic()
        try:
            pub = ckpt.publish_chunks(
                self.path, self.profile, update_count,
                lambda off, n, out: self.backend.download_snapshot_chunk(off, n),
                transfer=self.transfer)
        except BaseException as e:          # re-raised by wait() on the run loop's thread
            self.error = e
            return
        self.sha256 = pub.sha256
        self.published = update_count
        self.summary.publications += 1
        self.progress.published(update_count, time.monotonic() - t)
        if self.on_published is not None:
            self.on_published(update_count)

    def wait(self) -> None:
        """Join the publication in flight and re-raise its error."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def join(self, timeout_s: float) -> bool:
        """Join without raising (another error is in flight); False if the thread still runs."""
        if self.thread is not None:
            self.thread.join(timeout_s)
            if self.thread.is_alive():
                return False
            self.thread = None
        return True
