"""Streams, events and graphs: the order of the device's work and its timing.

Every driver return goes through host/driver.py's `check()` (`release()` on a close path).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .driver import check, cu, pointer, release

if TYPE_CHECKING:
    from .driver_device import Device


class Stream:
    """A non-blocking stream of the current context."""

    def __init__(self):
        d = cu()
        self.handle = check(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate")

    def query(self) -> bool:
        """True when idle, False while work is pending; raises DriverError on a device fault."""
        ret = cu().cuStreamQuery(self.handle)
        code = ret[0] if isinstance(ret, tuple) else ret
        if int(code) == int(cu().CUresult.CUDA_ERROR_NOT_READY):
            return False
        check(ret, "cuStreamQuery")
        return True

    def synchronize(self) -> None:
        check(cu().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def wait(self, event: "Event") -> None:
        """Work enqueued on this stream from now on waits for `event`'s recorded work (during
        stream capture: a graph edge from those nodes; a stream not yet capturing joins)."""
        check(cu().cuStreamWaitEvent(self.handle, event.handle, 0), "cuStreamWaitEvent")

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuStreamDestroy(self.handle), "cuStreamDestroy")
            self.handle = None


class Event:
    """An event of the current context: a timing event (`cuEventCreate` with CU_EVENT_DEFAULT),
    or with timing=False one that only orders work (CU_EVENT_DISABLE_TIMING: a graph's fork and
    join edges during stream capture)."""

    def __init__(self, timing: bool = True):
        d = cu()
        F = d.CUevent_flags
        flags = F.CU_EVENT_DEFAULT if timing else F.CU_EVENT_DISABLE_TIMING
        self.handle = check(d.cuEventCreate(flags), "cuEventCreate")

    def record(self, stream: Stream) -> None:
        check(cu().cuEventRecord(self.handle, stream.handle), "cuEventRecord")

    def synchronize(self) -> None:
        check(cu().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuEventDestroy(self.handle), "cuEventDestroy")
            self.handle = None


def elapsed_ms(start: Event, end: Event) -> float:
    """Device time between two completed events in ms (the driver's resolution: about 0.5 µs)."""
    return float(check(cu().cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime"))


class Graph:
    """A submission captured once from the stream and instantiated: one launch per issue."""

    def __init__(self, device: Device, record):
        """`record(stream)` enqueues the submission's launches on the capturing stream (and on
        streams it forks from it with events, joined back before it returns).  A capture that
        fails leaves nothing behind: the graph the driver made of it, if any, is destroyed."""
        d = cu()
        self.device = device
        self.graph = self.exec = None
        stream = device.stream
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(d.cuStreamBeginCapture(stream.handle, mode), "cuStreamBeginCapture")
        try:
            record(stream)
        except BaseException:
            self._abandon_capture(d, stream)
            raise
        self.graph = check(d.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
        try:
            self.exec = check(d.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _abandon_capture(d, stream: Stream) -> None:
        """End a capture whose recording failed; a graph the driver still returns (what was
        captured before the failure) is destroyed, never launched."""
        ret = d.cuStreamEndCapture(stream.handle)
        graph = ret[1] if isinstance(ret, tuple) and len(ret) > 1 else None
        release(ret, "cuStreamEndCapture")
        if graph is not None and pointer(graph):
            release(d.cuGraphDestroy(graph), "cuGraphDestroy")

    def launch(self) -> None:
        check(cu().cuGraphLaunch(self.exec, self.device.stream.handle), "cuGraphLaunch")

    def close(self) -> None:
        d = cu()
        if self.exec is not None:
            release(d.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
            self.exec = None
        if self.graph is not None:
            release(d.cuGraphDestroy(self.graph), "cuGraphDestroy")
            self.graph = None
