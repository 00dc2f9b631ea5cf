"""The device: device 0 with its primary context, device memory, the mapped staging region, copies.

Every driver return goes through host/driver/calls.py's `check()` (`release()` on a close path).
"""
from __future__ import annotations

import ctypes

from coppelius.errors import BackendUnavailable
from coppelius.driver.calls import (NO_GPU_HINT, DriverError, bindings_version, check,
                                    check_bindings_version, cu, pointer, release)
from coppelius.driver.stream import Stream


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


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def memcpy_htod(dst: int, src_host: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyHtoDAsync(dst, src_host, nbytes, stream.handle), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst_host: int, src: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemcpyDtoHAsync(dst_host, src, nbytes, stream.handle), "cuMemcpyDtoHAsync")


def memset_d8(dst: int, value: int, nbytes: int, stream: Stream) -> None:
    check(cu().cuMemsetD8Async(dst, value, nbytes, stream.handle), "cuMemsetD8Async")
