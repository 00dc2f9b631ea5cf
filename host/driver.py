"""The CUDA driver path: `check()`, the primary context, streams, memory, mapped staging, modules,
graphs.

Driver API only (`from cuda.bindings import driver`), imported lazily so that every other part of the
host runs without a driver.  Works with the 12.x and 13.x bindings: the primary context avoids
`cuCtxCreate`, whose signature 13.x changed.  Each wrapper is a small class; every driver return goes
through `check()`, which turns it into its values or a `DriverError` naming the call; close paths
go through `release()`, which reports a failure as a warning instead of raising it.
"""
from __future__ import annotations

import ctypes
import warnings

from .backend import BackendUnavailable, DeviceError

_cu = None
NO_GPU_HINT = "on a machine without a GPU, `--profile tiny --backend interpret` runs the plan on the CPU"


def cu():
    """The `cuda.bindings.driver` module, imported on first use."""
    global _cu
    if _cu is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:       # pragma: no cover - depends on the installation
            raise BackendUnavailable(f"cuda-python is not installed ({e})",
                                     "pip install 'cuda-python>=12.4'") from None
        _cu = driver
    return _cu


class DriverError(DeviceError):
    """A driver call returned an error: names the call and the CUresult."""


class ReleaseWarning(RuntimeWarning):
    """A driver call on a close path failed; reported, not raised (the run's outcome stands)."""


def error_name(code) -> str:
    """The CUresult's name from the bindings' enum (no driver or device needed), else its number."""
    try:
        return cu().CUresult(int(code)).name
    except Exception:
        return f"CUresult {int(code)}"


def check(ret, call: str):
    """Turn a cuda-python return tuple `(CUresult, *values)` into the values, or raise."""
    if isinstance(ret, tuple):
        code, values = ret[0], ret[1:]
    else:
        code, values = ret, ()
    if int(code) != 0:
        raise DriverError(f"{error_name(code)} from {call}", int(code))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def release(ret, call: str) -> DriverError | None:
    """`check()` for a close path: a failure is reported as a ReleaseWarning and returned."""
    try:
        check(ret, call)
    except DriverError as e:
        warnings.warn(f"{e} (while releasing)", ReleaseWarning, stacklevel=2)
        return e
    return None


def pointer(handle) -> int:
    """The integer address of a CUdeviceptr / CUstream / host pointer."""
    return int(handle)


class Device:
    """Device 0 with its primary context made current."""

    def __init__(self, ordinal: int = 0):
        d = cu()
        try:
            check(d.cuInit(0), "cuInit")
        except DriverError as e:
            raise BackendUnavailable(f"no usable NVIDIA GPU: {e}",
                                     NO_GPU_HINT) from None
        except Exception as e:          # DynamicLibNotFoundError: no libcuda on this machine
            raise BackendUnavailable(f"no NVIDIA driver on this machine ({type(e).__name__})",
                                     NO_GPU_HINT) from None
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if count <= ordinal:
            raise BackendUnavailable(f"no CUDA device {ordinal} ({count} found)",
                                     NO_GPU_HINT)
        self.handle = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.driver_version = int(check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
        raw = check(d.cuDeviceGetName(64, self.handle), "cuDeviceGetName")
        self.name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        A = d.CUdevice_attribute
        self.major = int(check(d.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle), "cuDeviceGetAttribute"))
        self.minor = int(check(d.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle), "cuDeviceGetAttribute"))
        self.can_map_host = int(check(d.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, self.handle), "cuDeviceGetAttribute"))
        self.context = check(d.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        check(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = Stream()

    def make_current(self) -> None:
        """Bind the primary context to the calling thread (a publisher thread needs it too)."""
        check(cu().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    @property
    def compute_capability(self) -> int:
        return 10 * self.major + self.minor

    def query(self) -> bool:
        """True when the submission stream is idle; raises DriverError on a device fault."""
        return self.stream.query()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        if getattr(self, "stream", None) is not None:
            self.stream.close()
            self.stream = None
        if getattr(self, "context", None) is not None:
            release(cu().cuDevicePrimaryCtxRelease(self.handle), "cuDevicePrimaryCtxRelease")
            self.context = None


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

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuStreamDestroy(self.handle), "cuStreamDestroy")
            self.handle = None


class DeviceBuffer:
    """`cuMemAlloc` memory, freed on close."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.handle = check(cu().cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")
        self.ptr = pointer(self.handle)

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuMemFree(self.handle), "cuMemFree")
            self.handle = None


def host_buffer(address: int, nbytes: int):
    """A writable, zero-copy Python buffer over host memory the driver allocated.

    cffi is the runtime dependency for this; where it is missing (the lent GPU image has none) a
    ctypes array over the same address serves, equally zero-copy."""
    try:
        import cffi
    except ImportError:
        return (ctypes.c_char * nbytes).from_address(address)
    ffi = cffi.FFI()
    return ffi.buffer(ffi.cast("char *", address), nbytes)


class MappedRegion:
    """Pinned host memory mapped into the device (`cuMemHostAlloc` with DEVICEMAP).

    `array` is a zero-copy numpy uint8 view (through cffi) that the host reads and writes;
    `device_ptr` is the address kernels use for the same bytes.
    """

    def __init__(self, nbytes: int):
        import numpy as np
        d = cu()
        flags = d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE
        self.nbytes = nbytes
        self.host_ptr = int(check(d.cuMemHostAlloc(nbytes, flags), "cuMemHostAlloc"))
        self.device_ptr = pointer(check(d.cuMemHostGetDevicePointer(self.host_ptr, 0),
                                        "cuMemHostGetDevicePointer"))
        self._buffer = host_buffer(self.host_ptr, nbytes)
        self.array = np.frombuffer(self._buffer, np.uint8)

    def close(self) -> None:
        if self.host_ptr:
            self.array = None
            self._buffer = None
            release(cu().cuMemFreeHost(self.host_ptr), "cuMemFreeHost")
            self.host_ptr = 0


class Module:
    """A PTX module loaded by the driver's JIT (the host never compiles)."""

    def __init__(self, ptx: bytes, name: str):
        if not ptx.endswith(b"\0"):
            ptx = ptx + b"\0"          # the driver reads PTX as a NUL-terminated string
        self.name = name
        image = ctypes.create_string_buffer(ptx, len(ptx))
        self.handle = check(cu().cuModuleLoadData(ctypes.addressof(image)),
                            f"cuModuleLoadData({name})")

    def function(self, entry: str):
        return check(cu().cuModuleGetFunction(self.handle, entry.encode()),
                     f"cuModuleGetFunction({entry})")

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None


class Kernel:
    """A function with its launch shape and the ctypes types of its parameters."""

    CTYPES = {"ptr": ctypes.c_uint64, "u64": ctypes.c_uint64, "i64": ctypes.c_int64,
              "u32": ctypes.c_uint32, "i32": ctypes.c_int32, "f32": ctypes.c_float,
              "u16": ctypes.c_uint16, "i16": ctypes.c_int16, "u8": ctypes.c_uint8,
              "i8": ctypes.c_int8, "f64": ctypes.c_double}

    def __init__(self, function, name: str, param_types: list[str], threads: int, shared: int,
                 scratch: tuple[int, ...] = ()):
        """`scratch`: bytes per program of each of Triton's hidden trailing scratch pointers
        (0: passed as null)."""
        self.function, self.name = function, name
        self.param_types, self.threads, self.shared = param_types, threads, shared
        self.scratch = tuple(scratch)
        if shared > 48 * 1024:
            d = cu()
            check(d.cuFuncSetAttribute(
                function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared), f"cuFuncSetAttribute({name})")

    def pack(self, values: list) -> "PackedParams":
        if len(values) != len(self.param_types):
            raise ValueError(f"{self.name}: {len(values)} arguments for "
                             f"{len(self.param_types)} parameters")
        return PackedParams([self.CTYPES[t](v) for t, v in zip(self.param_types, values)])

    def launch(self, stream: Stream, grid: tuple[int, int, int], params: "PackedParams") -> None:
        check(cu().cuLaunchKernel(self.function, *grid, self.threads, 1, 1, self.shared,
                                  stream.handle, params.address, 0), f"cuLaunchKernel({self.name})")


class PackedParams:
    """The `void**` array cuLaunchKernel reads; keeps the values alive as long as it lives."""

    def __init__(self, values: list):
        self.values = values
        self.array = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.addressof(v) for v in values])
        self.address = ctypes.addressof(self.array)


class Graph:
    """A submission captured once from the stream and instantiated: one launch per issue."""

    def __init__(self, device: Device, record):
        """`record(stream)` enqueues the submission's launches on the capturing stream."""
        d = cu()
        self.device = device
        stream = device.stream
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(d.cuStreamBeginCapture(stream.handle, mode), "cuStreamBeginCapture")
        try:
            record(stream)
        except BaseException:
            release(d.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
            raise
        self.graph = check(d.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
        self.exec = check(d.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def launch(self) -> None:
        check(cu().cuGraphLaunch(self.exec, self.device.stream.handle), "cuGraphLaunch")

    def close(self) -> None:
        d = cu()
        if getattr(self, "exec", None) is not None:
            release(d.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
            self.exec = None
        if getattr(self, "graph", None) is not None:
            release(d.cuGraphDestroy(self.graph), "cuGraphDestroy")
            self.graph = None


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def memcpy_htod(dst: int, src_host: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyHtoDAsync(dst, src_host, nbytes, stream.handle), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst_host: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoHAsync(dst_host, src, nbytes, stream.handle), "cuMemcpyDtoHAsync")


def memset_d8(dst: int, value: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemsetD8Async(dst, value, nbytes, stream.handle), "cuMemsetD8Async")
