"""The CUDA driver path: `check()`, the primary context, streams, timing events, memory, mapped
staging, modules, graphs.

Driver API only (`from cuda.bindings import driver`), imported lazily so that every other part of the
host runs without a driver.  Works with the 12.x and 13.x bindings: the primary context avoids
`cuCtxCreate`, whose signature 13.x changed.  Each wrapper is a small class; every driver return goes
through `check()`, which turns it into its values or a `DriverError` naming the call; close paths
go through `release()`, which reports a failure as a warning instead of raising it.

Bindings: cuda-bindings ≥ 12.9.1 (13.x: ≥ 13.0.0).  Those are the first releases whose driver calls
release the GIL ("Python bindings in every module, including driver, runtime, and nvrtc, now have the
GIL released before calling the underlying C APIs": cuda-bindings 12.9.1 and 13.0.0 release notes,
Aug 6, 2025); `cuda.bindings` itself exists since cuda-python 12.6.1 (Oct 7, 2024).  With older
bindings a publisher thread blocked in cuStreamSynchronize would hold the GIL and stall the run
loop's fence poll.  The bindings' major must not be newer than the driver's CUDA major: 12.x
bindings for a CUDA 12 driver, 13.x for a CUDA 13 driver (driver ≥ 580).
"""
from __future__ import annotations

import ctypes
import re
import warnings
from dataclasses import dataclass

from .backend import BackendUnavailable, DeviceError

_cu = None
# true from the state `make run` leaves on a machine without a GPU (tests/test_cli.py runs it)
NO_GPU_HINT = ("no GPU here: `make demo` runs the tiny profile on the CPU; with pip: pip install -e "
               "'.[demo]', then `coppelius run --profile tiny --backend interpret`")
BINDINGS_FLOOR = (12, 9, 1)     # pyproject.toml's floor; tests/test_cuda_backend_fake.py ties the two
BINDINGS_HINT = ("pip install 'cuda-bindings>=12.9.1,<13' for a CUDA 12 driver, "
                 "'cuda-bindings>=13.0.0,<14' for a CUDA 13 driver")
JIT_LOG_BYTES = 64 * 1024       # each of the JIT's info and error logs
STATIC_SHARED_LIMIT = 48 * 1024  # dynamic shared memory beyond this needs the per-function opt-in


def cu():
    """The `cuda.bindings.driver` module, imported on first use."""
    global _cu
    if _cu is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:       # pragma: no cover - depends on the installation
            raise BackendUnavailable(f"cuda-bindings is not installed ({e})", BINDINGS_HINT) from None
        check_bindings_version(bindings_version())
        _cu = driver
    return _cu


def bindings_version() -> str | None:
    """`cuda.bindings.__version__`, or None where it cannot be read."""
    try:
        from cuda.bindings import __version__
        return str(__version__)
    except Exception:
        return None


def _release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


class BindingsMismatch(BackendUnavailable):
    """The installed cuda-bindings cannot drive this driver without stalls or failures."""


def check_bindings_version(version: str | None, driver_version: int | None = None) -> None:
    """Refuse bindings older than BINDINGS_FLOOR, or of a newer CUDA major than the driver."""
    if version is None:
        return
    release = _release_tuple(version)
    if release < BINDINGS_FLOOR:
        raise BindingsMismatch(f"cuda-bindings {version} holds the GIL in driver calls (released "
                               f"from {'.'.join(map(str, BINDINGS_FLOOR))}): a publisher thread "
                               "would stall the fence poll", BINDINGS_HINT)
    if driver_version and release and release[0] > driver_version // 1000:
        raise BindingsMismatch(f"cuda-bindings {version} needs a CUDA {release[0]} driver; this one "
                               f"is CUDA {driver_version // 1000}.{driver_version % 1000 // 10}",
                               BINDINGS_HINT)


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
        # the most shared memory one block may use once a function opts in (static + dynamic)
        self.shared_optin = int(check(d.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.handle),
            "cuDeviceGetAttribute"))
        check_bindings_version(bindings_version(), self.driver_version)
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


class PtxRefused(BackendUnavailable):
    """The driver's JIT refused a PTX file; the message names the file and quotes the JIT log."""

    def __init__(self, name: str, code: int, log: str):
        flat = " | ".join(line.strip() for line in log.splitlines() if line.strip())
        super().__init__(f"the driver refused {name}: {error_name(code)} from cuModuleLoadDataEx; "
                         f"JIT log: {flat or '(empty)'}",
                         "PTX ISA 8.0 needs a CUDA 12.0 or newer driver; `coppelius doctor` "
                         "shows the driver and the target")
        self.code, self.log = code, log


def _log_text(buffer: bytearray) -> str:
    return bytes(buffer).split(b"\0", 1)[0].decode(errors="replace").strip()


class Module:
    """A PTX module loaded by the driver's JIT (the host never compiles), with the JIT's logs."""

    def __init__(self, ptx: bytes, name: str):
        d = cu()
        if not ptx.endswith(b"\0"):
            ptx = ptx + b"\0"          # the driver reads PTX as a NUL-terminated string
        self.name = name
        image = ctypes.create_string_buffer(ptx, len(ptx))
        # the bindings take bytearrays as the JIT's char* log buffers (numba-cuda does the same)
        info, error = bytearray(JIT_LOG_BYTES), bytearray(JIT_LOG_BYTES)
        O = d.CUjit_option
        options = [O.CU_JIT_INFO_LOG_BUFFER, O.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                   O.CU_JIT_ERROR_LOG_BUFFER, O.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                   O.CU_JIT_LOG_VERBOSE]
        values = [info, JIT_LOG_BYTES, error, JIT_LOG_BYTES, 1]
        ret = d.cuModuleLoadDataEx(ctypes.addressof(image), len(options), options, values)
        self.info_log = _log_text(info)     # empty when the driver's compute cache served it
        code = ret[0] if isinstance(ret, tuple) else ret
        if int(code) != 0:
            raise PtxRefused(name, int(code), _log_text(error))
        self.handle = ret[1]

    def function(self, entry: str):
        return check(cu().cuModuleGetFunction(self.handle, entry.encode()),
                     f"cuModuleGetFunction({entry})")

    def spills(self, entry: str) -> tuple[int, int] | None:
        """(spill store, spill load) bytes of `entry` from the JIT's verbose info log, or None."""
        # ptxas -v's lines: "Function properties for E", then "... N bytes spill stores, M bytes
        # spill loads" on the next line, whatever prefix the JIT puts before it
        m = re.search(rf"Function properties for {re.escape(entry)}\b[^\n]*\n[^\n]*?"
                      r"(\d+) bytes spill stores, (\d+) bytes spill loads", self.info_log)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def close(self) -> None:
        if self.handle is not None:
            release(cu().cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None


@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports for one loaded function (cuFuncGetAttribute)."""
    registers: int              # per thread
    local_bytes: int            # local memory per thread: spills and stack
    static_shared: int          # bytes per block, besides the launch's dynamic shared memory
    max_threads: int            # threads per block it can launch with, its registers permitting

    @classmethod
    def read(cls, function, name: str) -> "FunctionAttributes":
        d = cu()
        A = d.CUfunction_attribute

        def get(attr):
            return int(check(d.cuFuncGetAttribute(attr, function), f"cuFuncGetAttribute({name})"))
        return cls(registers=get(A.CU_FUNC_ATTRIBUTE_NUM_REGS),
                   local_bytes=get(A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                   static_shared=get(A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                   max_threads=get(A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))


class Kernel:
    """A function with its launch shape, the ctypes types of its parameters and what the driver
    reports for it (read at construction)."""

    CTYPES = {"ptr": ctypes.c_uint64, "u64": ctypes.c_uint64, "i64": ctypes.c_int64,
              "u32": ctypes.c_uint32, "i32": ctypes.c_int32, "f32": ctypes.c_float,
              "u16": ctypes.c_uint16, "i16": ctypes.c_int16, "u8": ctypes.c_uint8,
              "i8": ctypes.c_int8, "f64": ctypes.c_double}

    def __init__(self, function, name: str, param_types: list[str], threads: int, shared: int,
                 scratch: tuple[int, ...] = (), spills: tuple[int, int] | None = None,
                 pdl: bool = False):
        """`shared`: dynamic shared memory bytes per block; `scratch`: bytes per program of each
        of Triton's hidden trailing scratch pointers (0: passed as null); `spills`: (store, load)
        bytes from the JIT log when it ran; `pdl`: the kernel waits for the grids before it
        (griddepcontrol.wait) before it touches memory, so it may be launched programmatically."""
        self.function, self.name = function, name
        self.param_types, self.threads, self.shared = param_types, threads, shared
        self.scratch = tuple(scratch)
        self.spills = spills
        self.pdl = pdl
        self.attributes = FunctionAttributes.read(function, name)

    @property
    def shared_per_block(self) -> int:
        """Static + dynamic shared memory one block of this launch uses."""
        return self.attributes.static_shared + self.shared

    def opt_in_shared(self) -> None:
        """Allow the dynamic shared memory the launch asks (needed beyond 48 KiB)."""
        if self.shared > STATIC_SHARED_LIMIT:
            d = cu()
            check(d.cuFuncSetAttribute(
                self.function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.shared), f"cuFuncSetAttribute({self.name})")

    def pack(self, values: list) -> "PackedParams":
        if len(values) != len(self.param_types):
            raise ValueError(f"{self.name}: {len(values)} arguments for "
                             f"{len(self.param_types)} parameters")
        return PackedParams([self.CTYPES[t](v) for t, v in zip(self.param_types, values)])

    def launch(self, stream: Stream, grid: tuple[int, int, int], params: "PackedParams",
               programmatic: bool = False) -> None:
        """Enqueue one launch.  `programmatic`: resolve its dependency on the stream's previous
        kernel programmatically (cuLaunchKernelEx with programmatic stream serialization): it may
        launch once that kernel's blocks have all passed their griddepcontrol.launch_dependents,
        and waits at its own griddepcontrol.wait until that kernel is done.  Only a `pdl` kernel
        may be launched so: one without the wait would race its predecessor."""
        if not programmatic:
            check(cu().cuLaunchKernel(self.function, *grid, self.threads, 1, 1, self.shared,
                                      stream.handle, params.address, 0),
                  f"cuLaunchKernel({self.name})")
            return
        if not self.pdl:
            raise ValueError(f"{self.name}: a programmatic launch of a kernel that does not wait "
                             "for its predecessor; hint: rebuild the PTX (tools/build_ptx.py)")
        d = cu()
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.threads, 1, 1
        config.sharedMemBytes = self.shared
        config.hStream = stream.handle
        config.attrs = [attr]
        config.numAttrs = 1
        check(d.cuLaunchKernelEx(config, self.function, params.address, 0),
              f"cuLaunchKernelEx({self.name}, programmatic)")


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


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def memcpy_htod(dst: int, src_host: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyHtoDAsync(dst, src_host, nbytes, stream.handle), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst_host: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoHAsync(dst_host, src, nbytes, stream.handle), "cuMemcpyDtoHAsync")


def memset_d8(dst: int, value: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemsetD8Async(dst, value, nbytes, stream.handle), "cuMemsetD8Async")
