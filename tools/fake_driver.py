"""A stand-in for `cuda.bindings.driver` that runs on the CPU, for testing the cuda backend's logic.

Device memory is host memory, copies real; mapped staging is seen at its host address plus
DEVICE_ALIAS, so a wrong pointer is caught.  Launches are recorded; a graph launch replays them,
executing only the hand-written kernels: release (doorbell → semaphore record) and release_stage_in
(the input record and doorbell into device memory, then the pre-launch record), all the run loop
needs to observe fences, and the device check's calibration kernels (emulated:
tools/gpu_check/fake_calibration.py).  Every call returns `(CUresult, *values)` like the bindings.
Modules load through cuModuleLoadDataEx, JIT logs into the caller's buffers; opt-in shared memory,
function attributes, JIT refusals and a hung stream are configurable.  Timing events record the
host clock when the (synchronous) fake stream reaches them, or an emulated kernel's end.  Stream
capture is tracked per stream: a captured operation becomes a node whose dependencies are its
stream's frontier; cuEventRecord on a capturing stream remembers that frontier, cuStreamWaitEvent
adds it to the waiting stream's (a stream not yet capturing joins); cuStreamEndCapture refuses a
capture whose streams are not joined back.  The nodes (`graphs[handle]`, in capture order, as a
graph launch runs them) keep their edges and their stream's (clamped) priority.
"""
from __future__ import annotations

import ctypes
import enum
import re
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from coppelius.staging import layout as L
from tools.gpu_check.fake_calibration import DEVICE_ATTRIBUTES, FUNCTION_ATTRIBUTES, FakeCalibration

DEVICE_ALIAS = 0x7000_0000_0000        # mapped memory's device address = host address + this


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_PTX = 218
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904


OK = CUresult.CUDA_SUCCESS
# opt-in shared memory per block by compute capability (CUDA programming guide, bytes)
SHARED_OPTIN = {(8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (9, 0): 232448, (12, 0): 101376}
DEFAULT_FUNCTION = {"regs": 32, "local": 0, "static_shared": 0, "max_threads": 1024}


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


class _Device:
    """The device, its context and streams, and memory: device memory is host memory; mapped
    memory is seen at its host address + DEVICE_ALIAS."""

    # ---- device and context
    def cuInit(self, flags): return (OK,)
    def cuDeviceGetCount(self): return (OK, 1)
    def cuDeviceGet(self, i): return (OK, 0)
    def cuDriverGetVersion(self): return (OK, 13000)
    def cuDeviceGetName(self, n, dev): return (OK, b"Fake H200\0")
    def cuDeviceGetUuid(self, dev): return (OK, SimpleNamespace(bytes=b"fake-gpu-uuid-00"))
    def cuDeviceGetPCIBusId(self, n, dev): return (OK, b"0000:01:00.0\0")
    def cuDeviceGetAttribute(self, attr, dev):
        return (OK, {"major": self.cc[0], "minor": self.cc[1], "map": 1,
                     "optin": self.shared_optin}[attr])
    def cuDevicePrimaryCtxRetain(self, dev): return (OK, "ctx")
    def cuDevicePrimaryCtxRelease(self, dev): return (OK,)
    def cuCtxSetCurrent(self, ctx): return (OK,)
    def cuStreamCreate(self, flags):
        self.streams += 1
        return (OK, self.streams)

    def cuCtxGetStreamPriorityRange(self): return (OK, *self.priority_range)
    def cuStreamGetPriority(self, s): return (OK, self.stream_priorities.get(s, 0))

    def cuStreamCreateWithPriority(self, flags, priority):
        least, greatest = self.priority_range
        self.streams += 1
        self.stream_priorities[self.streams] = min(max(priority, greatest), least)   # clamped
        return (OK, self.streams)

    def cuStreamWaitEvent(self, stream, event, flags):
        if event not in self.events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        c = self.capturing
        if c is not None and event in c.events:       # an edge (a stream not capturing joins)
            c.frontier[stream] = c.frontier.get(stream, frozenset()) | c.events[event]
        return (OK,)                                  # outside capture: the fake runs in order
    def cuStreamDestroy(self, s): return (OK,)
    def cuGetErrorName(self, code): return (OK, CUresult(int(code)).name.encode())

    def cuStreamQuery(self, s):
        if self.sticky_error is not None:
            return (self.sticky_error,)
        return (CUresult.CUDA_ERROR_NOT_READY,) if self.busy else (OK,)

    def cuStreamSynchronize(self, s):
        if self.busy:
            raise AssertionError("fake device: cuStreamSynchronize on a hung stream never returns")
        return (self.sticky_error or OK,)

    # ---- memory
    def cuMemAlloc(self, n):
        buf = ctypes.create_string_buffer(n)
        ptr = ctypes.addressof(buf)
        self.allocations[ptr] = buf
        return (OK, ptr)

    def cuMemFree(self, ptr):
        self.allocations.pop(int(ptr), None)
        return (OK,)

    def cuMemHostAlloc(self, n, flags):
        assert flags & self.CU_MEMHOSTALLOC_DEVICEMAP
        buf = (ctypes.c_char * (n + 4096))()
        ptr = (ctypes.addressof(buf) + 4095) // 4096 * 4096
        self.host[ptr] = buf
        return (OK, ptr)

    def cuMemHostGetDevicePointer(self, p, flags): return (OK, int(p) + DEVICE_ALIAS)
    def cuMemFreeHost(self, p):
        self.host.pop(int(p), None)
        return (OK,)

    def to_host(self, device_ptr: int) -> int:
        """A device address as the host address holding those bytes."""
        for base, buf in self.allocations.items():
            if base <= device_ptr < base + ctypes.sizeof(buf):
                return device_ptr
        host = device_ptr - DEVICE_ALIAS
        for base, buf in self.host.items():
            if base <= host < base + ctypes.sizeof(buf):
                return host
        raise ValueError(f"fake device: address {device_ptr:#x} is not allocated")

    def _op(self, fn, stream, launch=None, programmatic=False):
        """Run `fn` now, or — on a stream taking part in a capture — make it a graph node."""
        if self.capturing is not None and stream in self.capturing.frontier:
            self.capturing.add(stream, fn, launch, programmatic,
                               self.stream_priorities.get(stream, 0) if launch else 0)
        else:
            fn()
        return (OK,)

    def cuMemcpyHtoDAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(self.to_host(int(dst)), int(src), n), s)

    def cuMemcpyDtoHAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(int(dst), self.to_host(int(src)), n), s)

    def cuMemcpyDtoDAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(self.to_host(int(dst)), self.to_host(int(src)), n),
                        s)

    def cuMemsetD8Async(self, dst, value, n, s):
        return self._op(lambda: ctypes.memset(self.to_host(int(dst)), value, n), s)


class _Modules:
    """Modules (the JIT log a load writes, refusals), function attributes, timing events."""

    # ---- modules
    def cuModuleLoadDataEx(self, image, n, options, values):
        assert n == len(options) == len(values)
        opts = dict(zip(options, values))
        text = ctypes.string_at(int(image)).decode("ascii")   # a NUL-terminated image address
        entries = set(re.findall(r"\.entry\s+(\w+)", text))
        if ".version" not in text:
            return self._jit_log(opts, "error", "ptxas fatal   : not a PTX file",
                                 CUresult.CUDA_ERROR_INVALID_PTX)
        for entry in sorted(entries):
            if entry in self.jit_errors:
                return self._jit_log(opts, "error", self.jit_errors[entry],
                                     CUresult.CUDA_ERROR_INVALID_PTX)
        info = []
        for entry in sorted(entries):
            f = {**DEFAULT_FUNCTION, **self.functions.get(entry, {})}
            spill = f.get("spill", 0)
            arch = f"sm_{self.cc[0]}{self.cc[1]}"
            info += [f"ptxas info    : Compiling entry function '{entry}' for '{arch}'",
                     f"ptxas info    : Function properties for {entry}",
                     f"    0 bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads",
                     f"ptxas info    : Used {f['regs']} registers"]
        self._jit_log(opts, "info", "\n".join(info), OK)
        handle = len(self.modules) + 1
        self.modules[handle] = entries
        return (OK, handle)

    @staticmethod
    def _jit_log(opts, which, text, code):
        buf = opts[which]
        data = text.encode()[:opts[f"{which}_n"] - 1] + b"\0"
        buf[:len(data)] = data
        return (code, None)

    def cuModuleGetFunction(self, module, name):
        name = name.decode()
        if name not in self.modules[module]:
            return (CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (OK, name)

    def cuFuncGetAttribute(self, attr, f):
        return (OK, {**DEFAULT_FUNCTION, **self.functions.get(f, {})}[attr])

    def cuModuleUnload(self, m): return (OK,)
    def cuFuncSetAttribute(self, f, attr, value):
        if value > self.shared_optin:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.shared_opt_ins[f] = value
        return (OK,)

    # ---- timing events: "device time" is host time (the fake runs work as it is enqueued) or later
    def cuEventCreate(self, flags):
        handle = max(self.events, default=0) + 1
        self.events[handle] = None
        if flags & self.CUevent_flags.CU_EVENT_DISABLE_TIMING:
            self.untimed.add(handle)
        return (OK, handle)

    def cuEventRecord(self, event, stream):
        if event not in self.events:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        c = self.capturing
        if c is not None and stream in c.frontier:     # the stream's frontier, for a wait
            c.events[event] = c.frontier[stream]
            return (OK,)
        return self._op(lambda: self.events.__setitem__(event, self.device_now(stream)), stream)

    def cuEventSynchronize(self, event):
        if self.busy:
            raise AssertionError("fake device: cuEventSynchronize on a hung stream never returns")
        return (self.sticky_error or OK,)

    def cuEventElapsedTime(self, start, end):
        t0, t1 = self.events.get(start), self.events.get(end)
        if t0 is None or t1 is None or {start, end} & self.untimed:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        return (OK, (t1 - t0) / 1e6)

    def cuEventDestroy(self, event):
        self.events.pop(event, None)
        self.untimed.discard(event)
        return (OK,)


class _Graphs:
    """Launches, stream capture into graphs, and graph launches (a graph runs its nodes in
    capture order; only the hand-written release kernels compute anything)."""

    # ---- launches and graphs
    def cuLaunchKernelEx(self, config, f, params, extra):
        """cuLaunchKernelEx with the one attribute the backend sets: programmatic stream
        serialization (sm_90 and later, as the driver has it)."""
        attrs = list(config.attrs)[:config.numAttrs]
        pss = self.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        if len(attrs) != config.numAttrs or any(a.id != pss for a in attrs):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        programmatic = any(a.value.programmaticStreamSerializationAllowed for a in attrs)
        if programmatic and self.cc < (9, 0):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
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

        def run():
            if f in ("release", "release_stage_in"):
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

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = Capture(stream, frontier={stream: frozenset()})
        return (OK,)

    def cuStreamEndCapture(self, stream):
        c, self.capturing = self.capturing, None
        if c is None or stream != c.origin:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        joined = c.ancestors(c.frontier[stream])
        if any(not set(f) <= joined for s, f in c.frontier.items() if s != stream):
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, None)
        handle = len(self.graphs) + 1
        self.graphs[handle] = c.nodes
        self.live_graphs.add(handle)
        return (OK, handle)

    def cuGraphInstantiate(self, graph, flags):
        if graph not in self.live_graphs:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        self.live_execs.add(("exec", graph))
        self.instantiate_flags[graph] = int(flags)
        return (OK, ("exec", graph))

    def cuGraphGetNodes(self, graph, n):        # a node: (graph, index); n = 0 asks the count
        nodes = [(graph, k) for k in range(len(self.graphs[graph]))]
        return (OK, nodes[:n], min(n, len(nodes)) if n else len(nodes))
    def cuGraphNodeGetType(self, node):         # 0: kernel, 1: memcpy (every other operation)
        return (OK, 0 if self.graphs[node[0]][node[1]].launch is not None else 1)
    def cuGraphKernelNodeGetAttribute(self, node, attr):
        return (OK, SimpleNamespace(priority=self.graphs[node[0]][node[1]].priority))

    def cuGraphLaunch(self, exec_, stream):
        if self.hang:
            self.busy = True            # never finishes: no release reaches the semaphores
            return (OK,)
        if self.fail_graph_launch is not None:
            self.sticky_error = self.fail_graph_launch
            return (OK,)                # the fault shows up later, as on a real device
        for node in self.graphs[exec_[1]]:
            node.run()
        return (OK,)

    def cuGraphExecDestroy(self, e):
        if e not in self.live_execs:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        self.live_execs.discard(e)
        return (OK,)

    def cuGraphDestroy(self, g):
        if g not in self.live_graphs:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        self.live_graphs.discard(g)
        return (OK,)


class FakeDriver(FakeCalibration, _Graphs, _Modules, _Device):
    """The bindings' names the backend reads; the fake device's state and options (__init__)."""
    CUresult = CUresult
    CU_MEMHOSTALLOC_PORTABLE = 1
    CU_MEMHOSTALLOC_DEVICEMAP = 2
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
                                         CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY="map",
                                         CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="optin",
                                         **DEVICE_ATTRIBUTES)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = SimpleNamespace(CU_EVENT_DEFAULT=0, CU_EVENT_DISABLE_TIMING=2)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUgraphInstantiate_flags = SimpleNamespace(CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY=8)
    CUgraphNodeType = SimpleNamespace(CU_GRAPH_NODE_TYPE_KERNEL=0)
    CUkernelNodeAttrID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PRIORITY=8)
    CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6)
    CUlaunchAttribute = staticmethod(lambda: SimpleNamespace(
        id=0, value=SimpleNamespace(programmaticStreamSerializationAllowed=0)))
    CUlaunchConfig = staticmethod(lambda: SimpleNamespace(
        gridDimX=0, gridDimY=0, gridDimZ=0, blockDimX=0, blockDimY=0, blockDimZ=0,
        sharedMemBytes=0, hStream=None, attrs=[], numAttrs=0))
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
                                           CU_FUNC_ATTRIBUTE_NUM_REGS="regs",
                                           CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES="local",
                                           CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES="static_shared",
                                           CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK="max_threads",
                                           **FUNCTION_ATTRIBUTES)
    CUjit_option = SimpleNamespace(CU_JIT_INFO_LOG_BUFFER="info",
                                   CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES="info_n",
                                   CU_JIT_ERROR_LOG_BUFFER="error",
                                   CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES="error_n",
                                   CU_JIT_LOG_VERBOSE="verbose")

    def __init__(self, cc=(9, 0), fail_graph_launch: CUresult | None = None,
                 shared_optin: int | None = None, jit_errors: dict | None = None,
                 functions: dict | None = None, hang: bool = False,
                 refuse_programmatic: CUresult | None = None, priority_range=(0, -5)):
        """`jit_errors`: entry name -> error log of a module the JIT refuses; `functions`: entry
        name -> attribute overrides ({"regs", "local", "static_shared", "max_threads",
        "spill"}); `hang`: graph launches never finish (the stream stays busy);
        `refuse_programmatic`: cuLaunchKernelEx with programmatic serialization returns it;
        `priority_range`: (least, greatest) stream priority ((0, 0): a device without)."""
        self.cc = cc
        self.fail_graph_launch = fail_graph_launch
        self.shared_optin = SHARED_OPTIN.get(cc, 101376) if shared_optin is None else shared_optin
        self.jit_errors = jit_errors or {}
        self.functions = functions or {}
        self.hang = hang
        self.refuse_programmatic = refuse_programmatic
        self.priority_range = priority_range
        self.stream_priorities = {}    # stream handle -> priority (streams made without: 0)
        self.instantiate_flags = {}    # graph handle -> the flags of its last cuGraphInstantiate
        self.busy = False              # a hung graph launch is "running"
        self.shared_opt_ins = {}       # function -> dynamic shared bytes allowed
        self.allocations = {}          # device ptr -> ctypes buffer
        self.host = {}                 # host ptr -> ctypes buffer (pinned, mapped)
        self.modules = {}
        self.capturing: Capture | None = None
        self.graphs = {}               # graph handle -> [Node] in capture order
        self.live_graphs = set()       # graph handles made and not yet destroyed
        self.live_execs = set()        # instantiated graphs not yet destroyed
        self.streams = 0               # stream handles handed out
        self.launch_log = []           # (function entry, grid, block, shared, params bytes)
        self.programmatic_log = []     # per launch_log record: launched programmatically
        self.sticky_error = None
        self.calls = []
        self.events = {}               # event handle -> host perf_counter_ns when "reached", or None
        self.untimed = set()           # events created with CU_EVENT_DISABLE_TIMING
