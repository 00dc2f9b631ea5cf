"""A stand-in for `cuda.bindings.driver` that runs on the CPU, for testing the cuda backend's logic.

Its launches, stream capture and graph launches are tools/fake_graphs.py's.  Device memory is
host memory, copies real; mapped staging is seen at its host address plus
DEVICE_ALIAS, so a wrong pointer is caught.  Launches are recorded; a graph launch replays them,
executing the hand-written kernels: release (doorbell → semaphore record) and release_stage_in
(the input record and doorbell into device memory, then the pre-launch record), all the run loop
needs to observe fences, and the device check's calibration kernels (emulated:
tools/gpu_check/fake_calibration.py).  With `execute=True` it also runs every Triton launch it
receives (tools/cpu_cuda/executor.py: the committed manifest entry of the loaded PTX, the
launch's own grid and parameter values, copied at the launch or capture as the driver copies
them, on this driver's memory), with the executor's checks (`divisible_by_16`, memcheck) failing
a launch as a device would (a sticky error); without, those launches are recorded, not run, and
nothing imports Triton (the device check's `--no-triton` steps).  `order` picks the topological
order of the captured edges a graph launch runs its nodes in: "capture" (capture order),
"earliest" (a side stream's ready node before the origin stream's), "latest" (the reverse), or
"random:SEED".  Every call returns `(CUresult, *values)` like the bindings.
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
from types import SimpleNamespace

from tools.fake_graphs import ORDERS, Capture, Function, Graphs
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
    CUDA_ERROR_MISALIGNED_ADDRESS = 716
    CUDA_ERROR_LAUNCH_FAILED = 719
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904


OK = CUresult.CUDA_SUCCESS
# opt-in shared memory per block by compute capability (CUDA programming guide, bytes)
SHARED_OPTIN = {(8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (9, 0): 232448, (12, 0): 101376}
DEFAULT_FUNCTION = {"regs": 32, "local": 0, "static_shared": 0, "max_threads": 1024}


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
        self.host_sizes[ptr] = n
        return (OK, ptr)

    def cuMemHostGetDevicePointer(self, p, flags): return (OK, int(p) + DEVICE_ALIAS)
    def cuMemFreeHost(self, p):
        self.host.pop(int(p), None)
        self.host_sizes.pop(int(p), None)
        return (OK,)

    def region(self, device_ptr: int):
        """The live allocation or mapped range holding a device address (the executor's
        Memory), or None."""
        from tools.cpu_cuda.executor import Region
        for base, buf in self.allocations.items():
            if base <= device_ptr < base + ctypes.sizeof(buf):
                return Region(base, ctypes.sizeof(buf), base)
        for base, n in self.host_sizes.items():
            if base + DEVICE_ALIAS <= device_ptr < base + DEVICE_ALIAS + n:
                return Region(base + DEVICE_ALIAS, n, base)
        return None

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
        if self.executor is not None:
            self.executor.module_loaded(handle, text.encode("ascii"))
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
        return (OK, Function(name, module))

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


class FakeDriver(FakeCalibration, Graphs, _Modules, _Device):
    """The bindings' names the backend reads; the fake device's state and options (__init__)."""
    CUresult = CUresult
    OK = OK
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
                 refuse_programmatic: CUresult | None = None, priority_range=(0, -5),
                 execute: bool = False, order: str = "capture", executor=None):
        """`jit_errors`: entry name -> error log of a module the JIT refuses; `functions`: entry
        name -> attribute overrides ({"regs", "local", "static_shared", "max_threads",
        "spill"}); `hang`: graph launches never finish (the stream stays busy);
        `refuse_programmatic`: cuLaunchKernelEx with programmatic serialization returns it;
        `priority_range`: (least, greatest) stream priority ((0, 0): a device without);
        `execute`: run every Triton launch (tools/cpu_cuda/executor.py; imports Triton), or hand
        in an `executor` made elsewhere; `order`: the graph launch order (`topological`)."""
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
        self.graph_origins = {}        # graph handle -> its capture's origin stream
        self.host_sizes = {}           # host ptr -> bytes asked of cuMemHostAlloc
        if order not in ORDERS and not order.startswith("random:"):
            raise ValueError(f"graph order {order!r}: one of {', '.join(ORDERS)} or random:SEED")
        self.order = order
        if execute and executor is None:
            from tools.cpu_cuda.executor import Executor
            executor = Executor(self)
        self.executor = executor
        self.live_graphs = set()       # graph handles made and not yet destroyed
        self.live_execs = set()        # instantiated graphs not yet destroyed
        self.streams = 0               # stream handles handed out
        self.launch_log = []           # (function entry, grid, block, shared, params bytes)
        self.programmatic_log = []     # per launch_log record: launched programmatically
        self.sticky_error = None
        self.calls = []
        self.events = {}               # event handle -> host perf_counter_ns when "reached", or None
        self.untimed = set()           # events created with CU_EVENT_DISABLE_TIMING
