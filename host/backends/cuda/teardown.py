"""The cuda backend's teardown: wait a bounded time for issued work, then free in reverse order.

What the GPU may still touch after the wait (a hung kernel, a fence that never came, a thread still
streaming through staging) is never freed: process exit frees it.  A failure while freeing is
reported as a ReleaseWarning, never raised: the run's outcome stands.
"""
from __future__ import annotations

import time
import warnings

from coppelius.errors import DeviceError
from coppelius.driver.calls import ReleaseWarning

DRAIN_POLL_S = 1e-3


class Closers:
    """What the cuda backend and its collaborators made that close() frees (device memory, mapped
    regions, modules, streams, the device), in order of making; one object handed to each."""

    def __init__(self):
        self.items: list = []

    def append(self, thing):
        """Keep `thing` to close, after everything kept before it; returns it."""
        self.items.append(thing)
        return thing

    def take(self) -> list:
        """Everything kept, in order of making, handed over for closing; none kept after."""
        items, self.items = self.items, []
        return items

    def __len__(self) -> int:
        return len(self.items)


def drained(streams, timeout_s: float) -> bool:
    """Wait up to timeout_s for every stream to go idle; a faulted stream runs nothing more."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if all(s.query() for s in streams):
                return True
        except DeviceError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(DRAIN_POLL_S)


def free(graphs, closers) -> None:
    """The graphs first, then every allocation in reverse order of making; each failure reported
    (the driver's through `release()`, any other as a ReleaseWarning), the rest still freed."""
    for g in graphs:
        g.close()
    for c in reversed(closers):
        try:
            c.close()
        except Exception as e:          # not a driver return: still report, keep closing
            warnings.warn(f"closing {type(c).__name__}: {type(e).__name__}: {e}",
                          ReleaseWarning, stacklevel=3)
