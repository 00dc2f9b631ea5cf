"""Streams, events and graphs: the order of the device's work and its timing.

Every driver return goes through host/driver/calls.py's `check()` (`release()` on a close path).
"""
from __future__ import annotations

from coppelius.driver.calls import check, cu, pointer, release


class Stream:
    """A non-blocking stream of the current context, at the default priority or at `priority`
    (cuStreamCreateWithPriority: within priority_range(); the driver clamps a value outside)."""

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """The current context's (least, greatest) stream priority: lower numbers are higher
        priorities, 0 the default; (0, 0) where the device has none
        (cuCtxGetStreamPriorityRange)."""
        least, greatest = check(cu().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def __init__(self, priority: int | None = None):
        d = cu()
        flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
        if priority is None:
            self.handle = check(d.cuStreamCreate(flags), "cuStreamCreate")
        else:
            self.handle = check(d.cuStreamCreateWithPriority(flags, int(priority)),
                                "cuStreamCreateWithPriority")

    @property
    def priority(self) -> int:
        """The priority the driver gave the stream (cuStreamGetPriority: after any clamping)."""
        return int(check(cu().cuStreamGetPriority(self.handle), "cuStreamGetPriority"))

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

    def __init__(self, stream: Stream, record, node_priority: bool = False):
        """Captured from `stream` (the submission stream), and launched into it.  `record(stream)`
        enqueues the submission's launches on the capturing stream (and on streams it forks from
        it with events, joined back before it returns).  A capture that fails leaves nothing
        behind: the graph the driver made of it, if any, is destroyed.
        `node_priority`: instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY, so each
        kernel node runs at the priority capture copied into it from its stream; without it
        every node runs at the priority of the stream the graph is launched into."""
        d = cu()
        F = d.CUgraphInstantiate_flags
        flags = int(F.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY) if node_priority else 0
        self.stream = stream
        self.graph = self.exec = None
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(d.cuStreamBeginCapture(stream.handle, mode), "cuStreamBeginCapture")
        try:
            record(stream)
        except BaseException:
            self._abandon_capture(d, stream)
            raise
        self.graph = check(d.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
        try:
            self.exec = check(d.cuGraphInstantiate(self.graph, flags), "cuGraphInstantiate")
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
        check(cu().cuGraphLaunch(self.exec, self.stream.handle), "cuGraphLaunch")

    def kernel_priorities(self) -> list[int]:
        """The priority attribute of each kernel node of the captured graph, as the driver reports
        it (cuGraphGetNodes, cuGraphKernelNodeGetAttribute PRIORITY), in the driver's order."""
        d = cu()
        _, count = check(d.cuGraphGetNodes(self.graph, 0), "cuGraphGetNodes")
        nodes, _ = check(d.cuGraphGetNodes(self.graph, count), "cuGraphGetNodes")
        kernel = int(d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL)
        attr = d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY
        return [int(check(d.cuGraphKernelNodeGetAttribute(n, attr),
                          "cuGraphKernelNodeGetAttribute").priority)
                for n in nodes[:count]
                if int(check(d.cuGraphNodeGetType(n), "cuGraphNodeGetType")) == kernel]

    def close(self) -> None:
        d = cu()
        if self.exec is not None:
            release(d.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
            self.exec = None
        if self.graph is not None:
            release(d.cuGraphDestroy(self.graph), "cuGraphDestroy")
            self.graph = None
