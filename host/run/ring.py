"""The submission ring: doorbell, gpPut/gpGet, fence polling on the mapped semaphore, timestamps.

One `Ring` per run.  `issue()` writes the sequence number into the doorbell and launches the
instantiated submission; `wait()` polls the submission's final-release payload in staging until it
equals that sequence number, checking the backend for device errors while it polls (CONTRACT §7).
Every issue gets one timestamp-table entry (CONTRACT §7), filled in place in a preallocated array.
"""
from __future__ import annotations

import time

import numpy as np

from coppelius.staging import layout as L
from coppelius.staging import records as R

from coppelius.errors import DeviceError

DEFAULT_FENCE_TIMEOUT_S = 120.0
SPIN_S = 0.002          # spin this long before sleeping between polls: a step is ~1 ms on an H200
POLL_SLEEP_S = 50e-6
QUERY_EVERY_S = 0.001   # how often the stream is asked for a device error while polling


class FenceTimeout(DeviceError):
    pass


class Ring:
    def __init__(self, backend, capacity: int, timeout_s: float = DEFAULT_FENCE_TIMEOUT_S):
        self.backend = backend
        self.views = backend.staging
        self.timeout_s = timeout_s
        self.gp_put = 0                 # issues made (1-based sequence numbers)
        self.gp_get = 0                 # fences observed
        self.table = np.zeros(capacity, R.TIMESTAMP_ENTRY.dtype)  # (issues,) timestamp entries
        self._final = [self.views.u32(L.semaphore_slot(i) + L.SLOT_FINAL_RELEASE, 1)
                       for i in range(len(L.SUBMISSIONS))]

    @property
    def issues(self) -> int:
        return self.gp_put

    def entries(self) -> np.ndarray:
        return self.table[:self.gp_put]

    def issue(self, submission: int, context: int, step: int | None) -> int:
        seq = self.gp_put + 1
        e = self.table[self.gp_put]
        e["submission"], e["sequence"], e["context"] = submission, seq, context
        e["step"] = R.TIMESTAMP_NO_STEP if step is None else step
        self.views.doorbell[0] = seq
        e["host_wall_issue_ns"] = time.clock_gettime_ns(time.CLOCK_REALTIME)
        e["host_issue_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.gp_put = seq
        try:
            self.backend.issue(submission)
        except DeviceError:
            e["flags"] |= R.FLAG_ERROR
            raise
        return seq

    def wait(self, submission: int, seq: int) -> None:
        """Poll the mapped final-release payload until it equals `seq`."""
        payload = self._final[submission]
        e = self.table[seq - 1]
        start = time.monotonic()
        next_query = start + QUERY_EVERY_S
        try:
            while payload[0] != seq:
                now = time.monotonic()
                if now >= next_query:
                    idle = self.backend.check()
                    next_query = now + QUERY_EVERY_S
                    if idle is True and payload[0] != seq:
                        raise DeviceError(
                            f"{L.SUBMISSIONS[submission]} issue {seq}: the stream went idle but "
                            f"the final release holds {int(payload[0])}, not {seq}")
                    if now - start > self.timeout_s:
                        raise FenceTimeout(f"{L.SUBMISSIONS[submission]} issue {seq}: no fence "
                                           f"after {self.timeout_s:.0f} s",
                                           R.INFO_FENCE_TIMEOUT)
                if now - start > SPIN_S:
                    time.sleep(POLL_SLEEP_S)
        except DeviceError:
            e["flags"] |= R.FLAG_ERROR
            raise
        e["host_fence_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        slot = self.views.semaphores[submission]
        e["device_prelaunch_ns"] = slot["prelaunch_timestamp"]
        e["device_final_ns"] = slot["final_timestamp"]
        e["flags"] |= R.FLAG_FENCE_OBSERVED
        self.gp_get += 1

    def run(self, submission: int, context: int, step: int | None) -> int:
        seq = self.issue(submission, context, step)
        self.wait(submission, seq)
        return seq
