"""The fake driver's launches, stream capture and graph launches (tools/fake_driver.py's mixin).

A captured operation becomes a `Node` whose dependencies are its stream's frontier; a graph launch
runs the nodes in a topological order of the captured edges (`topological`: as captured, or an
adversarial order: a side lane as early or as late as its edges allow, or a seeded random one),
executing the hand-written release kernels here and, with the driver's executor
(tools/cpu_cuda/executor.py), every Triton launch; without one those launches are recorded only.
"""
from __future__ import annotations

import ctypes
import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from coppelius.staging import layout as L

HAND_WRITTEN = ("release", "release_stage_in")      # run by the fake itself
ORDERS = ("capture", "earliest", "latest")           # and "random:SEED"


class Function(str):
    """A function handle: its entry name (what the launch log records) and its module."""
    module: int

    def __new__(cls, name: str, module: int):
        f = super().__new__(cls, name)
        f.module = module
        return f


def topological(nodes: list, origin: int, order: str) -> list[int]:
    """The indices of a graph's nodes in a topological order of their captured edges: "capture"
    (as captured), "earliest" (among the ready nodes, one of another stream than the origin's
    first: a side lane as early as its edges allow), "latest" (the origin stream's first), or
    "random:SEED" (a seeded choice among the ready nodes).  Ties go to the earliest captured."""
    if order == "capture":
        return list(range(len(nodes)))
    pick = random.Random(int(order.split(":", 1)[1])) if order.startswith("random:") else None
    if pick is None and order not in ORDERS:
        raise ValueError(f"graph order {order!r}: one of {', '.join(ORDERS)} or random:SEED")
    waiting = {i: set(n.deps) for i, n in enumerate(nodes)}
    done, out = set(), []
    while waiting:
        ready = sorted(i for i, deps in waiting.items() if deps <= done)
        if pick is not None:
            i = pick.choice(ready)
        else:
            side = [r for r in ready if (nodes[r].stream != origin) == (order == "earliest")]
            i = (side or ready)[0]
        out.append(i)
        done.add(i)
        del waiting[i]
    return out


@dataclass
class Node:
    """One captured operation: what it runs, the nodes it waits for, the stream it was captured
    on, and for a kernel its launch_log record."""
    run: object
    deps: frozenset
    stream: int
    launch: tuple | None = None
    programmatic: bool = False     # its edge to its stream's previous node is programmatic
    priority: int = 0              # a kernel's: its stream's, copied at capture as the driver does


@dataclass
class Capture:
    """A stream capture in progress: the nodes so far, each capturing stream's frontier (the
    nodes its next operation waits for), and the frontier each recorded event holds."""
    origin: int
    nodes: list = field(default_factory=list)
    frontier: dict = field(default_factory=dict)
    events: dict = field(default_factory=dict)

    def add(self, stream, run, launch=None, programmatic=False, priority=0) -> None:
        self.nodes.append(Node(run, frozenset(self.frontier[stream]), stream, launch,
                               programmatic, priority))
        self.frontier[stream] = frozenset({len(self.nodes) - 1})

    def ancestors(self, nodes) -> set:
        seen, todo = set(), list(nodes)
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += self.nodes[n].deps
        return seen


class Graphs:
    """Launches, stream capture into graphs, and graph launches (a graph runs its nodes in
    capture order; only the hand-written release kernels compute anything)."""

    # ---- launches and graphs
    def cuLaunchKernelEx(self, config, f, params, extra):
        """cuLaunchKernelEx with the one attribute the backend sets: programmatic stream
        serialization (sm_90 and later, as the driver has it)."""
        attrs = list(config.attrs)[:config.numAttrs]
        pss = self.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        if len(attrs) != config.numAttrs or any(a.id != pss for a in attrs):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        programmatic = any(a.value.programmaticStreamSerializationAllowed for a in attrs)
        if programmatic and self.cc < (9, 0):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        if programmatic and self.refuse_programmatic is not None:
            return (self.refuse_programmatic,)
        return self.cuLaunchKernel(f, config.gridDimX, config.gridDimY, config.gridDimZ,
                                   config.blockDimX, config.blockDimY, config.blockDimZ,
                                   config.sharedMemBytes, config.hStream, params, extra,
                                   programmatic=programmatic)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra,
                       programmatic=False):
        # the backend keeps its packed parameters alive as long as its graphs: decode them later
        record = (f, (gx, gy, gz), (bx, by, bz), shared, int(params))
        self.launch_log.append(record)
        self.programmatic_log.append(programmatic)
        executed = self._executed(f, (gx, gy, gz), int(params))
        if executed is not None:
            return self._op(executed, stream, record, programmatic)

        def run():
            if f in HAND_WRITTEN:
                n = 4 if f == "release_stage_in" else 2
                ptrs = (ctypes.c_void_p * n).from_address(record[4])
                doorbell, slot = (ctypes.c_uint64.from_address(ptrs[i]).value for i in range(2))
                seq = ctypes.c_uint32.from_address(self.to_host(doorbell)).value
                if f == "release_stage_in":           # 8 KiB record, then the doorbell
                    src, dst = (ctypes.c_uint64.from_address(ptrs[i]).value for i in (2, 3))
                    ctypes.memmove(self.to_host(dst), self.to_host(src), L.INPUT_RECORD_BYTES)
                    doorbell_copy = self.to_host(dst) + L.INPUT_RECORD_BYTES
                    ctypes.c_uint32.from_address(doorbell_copy).value = seq
                base = self.to_host(slot)
                ctypes.c_uint64.from_address(base + 8).value = time.time_ns()
                ctypes.c_uint32.from_address(base + 4).value = 0
                ctypes.c_uint32.from_address(base).value = seq
        return self._op(run, stream, record, programmatic)

    def _executed(self, f, grid, params: int):
        """With an executor: the run of a Triton launch, its parameter values read now (the driver
        copies them at the launch or capture); None for the hand-written kernels and without."""
        if self.executor is None or f in HAND_WRITTEN:
            return None
        entry = self.executor.entry(getattr(f, "module", None), str(f))
        if entry is None:
            return None
        pointers = (ctypes.c_void_p * len(entry.params)).from_address(params)
        blob = b"".join(ctypes.string_at(pointers[i], p.nbytes)
                        for i, p in enumerate(entry.params))
        values = entry.decode(blob)

        def run():
            from tools.cpu_cuda.executor import LaunchFailed
            try:
                self.executor.launch(entry, grid, values)
            except LaunchFailed as e:
                self.sticky_error = self.CUresult(e.code)
        return run

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = Capture(stream, frontier={stream: frozenset()})
        return (self.OK,)

    def cuStreamEndCapture(self, stream):
        c, self.capturing = self.capturing, None
        if c is None or stream != c.origin:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, None)
        joined = c.ancestors(c.frontier[stream])
        if any(not set(f) <= joined for s, f in c.frontier.items() if s != stream):
            return (self.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, None)
        handle = len(self.graphs) + 1
        self.graphs[handle] = c.nodes
        self.graph_origins[handle] = c.origin
        self.live_graphs.add(handle)
        return (self.OK, handle)

    def cuGraphInstantiate(self, graph, flags):
        if graph not in self.live_graphs:
            return (self.CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        self.live_execs.add(("exec", graph))
        self.instantiate_flags[graph] = int(flags)
        return (self.OK, ("exec", graph))

    def cuGraphGetNodes(self, graph, n):        # a node: (graph, index); n = 0 asks the count
        nodes = [(graph, k) for k in range(len(self.graphs[graph]))]
        return (self.OK, nodes[:n], min(n, len(nodes)) if n else len(nodes))
    def cuGraphNodeGetType(self, node):         # 0: kernel, 1: memcpy (every other operation)
        return (self.OK, 0 if self.graphs[node[0]][node[1]].launch is not None else 1)
    def cuGraphKernelNodeGetAttribute(self, node, attr):
        return (self.OK, SimpleNamespace(priority=self.graphs[node[0]][node[1]].priority))

    def cuGraphLaunch(self, exec_, stream):
        if self.hang:
            self.busy = True            # never finishes: no release reaches the semaphores
            return (self.OK,)
        if self.fail_graph_launch is not None:
            self.sticky_error = self.fail_graph_launch
            return (self.OK,)                # the fault shows up later, as on a real device
        if self.sticky_error is not None:
            return (self.sticky_error,)
        nodes = self.graphs[exec_[1]]
        for i in topological(nodes, self.graph_origins[exec_[1]], self.order):
            if self.sticky_error is not None:
                break                   # a faulted device runs nothing more
            nodes[i].run()
        return (self.OK,)

    def cuGraphExecDestroy(self, e):
        if e not in self.live_execs:
            return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)
        self.live_execs.discard(e)
        return (self.OK,)

    def cuGraphDestroy(self, g):
        if g not in self.live_graphs:
            return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)
        self.live_graphs.discard(g)
        return (self.OK,)


