"""A stand-in for `cuda.bindings.driver` that runs on the CPU, for testing the cuda backend's logic.

Device memory is host memory (so copies are real); the mapped staging region's device address is
its host address plus DEVICE_ALIAS, so a wrong pointer is caught.  Launches are recorded; a graph
launch replays them, executing only the hand-written kernels — release (doorbell → semaphore
record) and release_stage_in (the input record and doorbell into device memory, then the
pre-launch record) — which is all the run loop needs to observe fences.  Every call returns `(CUresult, *values)` like the bindings.
"""
from __future__ import annotations

import ctypes
import enum
import re
import time
from types import SimpleNamespace

from staging import layout as SL

DEVICE_ALIAS = 0x7000_0000_0000        # mapped memory's device address = host address + this


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


OK = CUresult.CUDA_SUCCESS


class FakeDriver:
    CUresult = CUresult
    CU_MEMHOSTALLOC_PORTABLE = 1
    CU_MEMHOSTALLOC_DEVICEMAP = 2
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
                                         CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY="map")
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self, cc=(9, 0), fail_graph_launch: CUresult | None = None):
        self.cc = cc
        self.fail_graph_launch = fail_graph_launch
        self.allocations = {}          # device ptr -> ctypes buffer
        self.host = {}                 # host ptr -> ctypes buffer (pinned, mapped)
        self.modules = {}
        self.capturing = None
        self.graphs = {}
        self.launch_log = []           # (function entry, grid, block, shared, params bytes)
        self.sticky_error = None
        self.calls = []

    # ---- device and context
    def cuInit(self, flags): return (OK,)
    def cuDeviceGetCount(self): return (OK, 1)
    def cuDeviceGet(self, i): return (OK, 0)
    def cuDriverGetVersion(self): return (OK, 13000)
    def cuDeviceGetName(self, n, dev): return (OK, b"Fake H200\0")
    def cuDeviceGetAttribute(self, attr, dev):
        return (OK, {"major": self.cc[0], "minor": self.cc[1], "map": 1}[attr])
    def cuDevicePrimaryCtxRetain(self, dev): return (OK, "ctx")
    def cuDevicePrimaryCtxRelease(self, dev): return (OK,)
    def cuCtxSetCurrent(self, ctx): return (OK,)
    def cuStreamCreate(self, flags): return (OK, 1)
    def cuStreamDestroy(self, s): return (OK,)
    def cuGetErrorName(self, code): return (OK, CUresult(int(code)).name.encode())

    def cuStreamQuery(self, s):
        if self.sticky_error is not None:
            return (self.sticky_error,)
        return (OK,)

    def cuStreamSynchronize(self, s):
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

    def _op(self, fn):
        if self.capturing is not None:
            self.capturing.append(fn)
        else:
            fn()
        return (OK,)

    def cuMemcpyHtoDAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(self.to_host(int(dst)), int(src), n))

    def cuMemcpyDtoHAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(int(dst), self.to_host(int(src)), n))

    def cuMemcpyDtoDAsync(self, dst, src, n, s):
        return self._op(lambda: ctypes.memmove(self.to_host(int(dst)), self.to_host(int(src)), n))

    def cuMemsetD8Async(self, dst, value, n, s):
        return self._op(lambda: ctypes.memset(self.to_host(int(dst)), value, n))

    # ---- modules
    def cuModuleLoadData(self, image):
        text = ctypes.string_at(int(image)).decode("ascii")   # a NUL-terminated image address
        if not text.startswith("//") and ".version" not in text:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        entries = set(re.findall(r"\.entry\s+(\w+)", text))
        handle = len(self.modules) + 1
        self.modules[handle] = entries
        return (OK, handle)

    def cuModuleGetFunction(self, module, name):
        name = name.decode()
        if name not in self.modules[module]:
            return (CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (OK, name)

    def cuModuleUnload(self, m): return (OK,)
    def cuFuncSetAttribute(self, f, attr, value): return (OK,)

    # ---- launches and graphs
    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # the backend keeps its packed parameters alive as long as its graphs: decode them later
        record = (f, (gx, gy, gz), (bx, by, bz), shared, int(params))
        self.launch_log.append(record)

        def run():
            if f in ("release", "release_stage_in"):
                ptrs = (ctypes.c_void_p * (4 if f == "release_stage_in" else 2)).from_address(record[4])
                doorbell, slot = (ctypes.c_uint64.from_address(ptrs[i]).value for i in range(2))
                seq = ctypes.c_uint32.from_address(self.to_host(doorbell)).value
                if f == "release_stage_in":           # 8 KiB record, then the doorbell
                    src, dst = (ctypes.c_uint64.from_address(ptrs[i]).value for i in (2, 3))
                    ctypes.memmove(self.to_host(dst), self.to_host(src), SL.INPUT_RECORD_BYTES)
                    ctypes.c_uint32.from_address(self.to_host(dst) + SL.INPUT_RECORD_BYTES).value = seq
                base = self.to_host(slot)
                ctypes.c_uint64.from_address(base + 8).value = time.time_ns()
                ctypes.c_uint32.from_address(base + 4).value = 0
                ctypes.c_uint32.from_address(base).value = seq
        return self._op(run)

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (OK,)

    def cuStreamEndCapture(self, stream):
        ops, self.capturing = self.capturing, None
        handle = len(self.graphs) + 1
        self.graphs[handle] = ops
        return (OK, handle)

    def cuGraphInstantiate(self, graph, flags): return (OK, ("exec", graph))

    def cuGraphLaunch(self, exec_, stream):
        if self.fail_graph_launch is not None:
            self.sticky_error = self.fail_graph_launch
            return (OK,)                # the fault shows up later, as on a real device
        for op in self.graphs[exec_[1]]:
            op()
        return (OK,)

    def cuGraphExecDestroy(self, e): return (OK,)
    def cuGraphDestroy(self, g): return (OK,)
