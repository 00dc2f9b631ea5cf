"""The device: device N (an ordinal under CUDA_VISIBLE_DEVICES, as CUDA counts) with its primary
context and identity (UUID, PCI bus id), device memory, the mapped staging region, copies.

Every driver return goes through host/driver/calls.py's `check()` (`release()` on a close path).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from coppelius.errors import BackendUnavailable
from coppelius.driver.calls import (NO_GPU_HINT, DriverError, bindings_version, check,
                                    check_bindings_version, cu, pointer, release)
from coppelius.driver.stream import Stream


PCI_BUS_ID_BYTES = 64           # cuDeviceGetPCIBusId needs 13; room for a 32-bit domain
UUID_GROUPS = (8, 4, 4, 4, 12)  # hex digits per group of "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


def uuid_text(raw: bytes) -> str:
    """A 16-byte GPU UUID as nvidia-smi and NVML spell it ("GPU-" and five hex groups)."""
    h, parts = raw.hex(), []
    for n in UUID_GROUPS:
        parts.append(h[:n])
        h = h[n:]
    return "GPU-" + "-".join(parts)


def pci_bus_id_text(domain: int, bus: int, device: int, function: int) -> str:
    """The PCI bus id as cuDeviceGetPCIBusId spells it: "0000:65:00.0"."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


@dataclass(frozen=True)
class GpuIdentity:
    """Which GPU: its ordinal in this process, its 16-byte UUID and its PCI bus id."""
    ordinal: int
    name: str
    uuid: bytes                 # 16 bytes (cuDeviceGetUuid)
    pci_bus_id: str             # "0000:65:00.0" (cuDeviceGetPCIBusId): domain:bus:device.function

    @property
    def pci_fields(self) -> tuple[int, int, int, int]:
        """(domain, bus, device, function) parsed from the bus id's hexadecimal fields."""
        domain, bus, rest = self.pci_bus_id.split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)

    @property
    def uuid_text(self) -> str:
        return uuid_text(self.uuid)


def init_driver() -> int:
    """cuInit; the number of visible devices.  BackendUnavailable without a driver or a GPU."""
    d = cu()
    try:
        check(d.cuInit(0), "cuInit")
    except DriverError as e:
        raise BackendUnavailable(f"no usable NVIDIA GPU: {e}", NO_GPU_HINT) from None
    except Exception as e:          # DynamicLibNotFoundError: no libcuda on this machine
        raise BackendUnavailable(f"no NVIDIA driver on this machine ({type(e).__name__})",
                                 NO_GPU_HINT) from None
    return int(check(d.cuDeviceGetCount(), "cuDeviceGetCount"))


def device_handle(ordinal: int, count: int):
    if not 0 <= ordinal < count:
        raise BackendUnavailable(f"no CUDA device {ordinal} ({count} found)",
                                 "--device counts from 0 among the devices CUDA_VISIBLE_DEVICES "
                                 "leaves visible" if count else NO_GPU_HINT)
    return check(cu().cuDeviceGet(ordinal), "cuDeviceGet")


def identity_of(ordinal: int, handle) -> GpuIdentity:
    """The name, UUID and PCI bus id of one device, from the driver (no context needed)."""
    d = cu()
    raw = check(d.cuDeviceGetName(64, handle), "cuDeviceGetName")
    name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
    uuid = bytes(check(d.cuDeviceGetUuid(handle), "cuDeviceGetUuid").bytes)[:16]
    bus = check(d.cuDeviceGetPCIBusId(PCI_BUS_ID_BYTES, handle), "cuDeviceGetPCIBusId")
    bus = bytes(bus).split(b"\0", 1)[0].decode("ascii", errors="replace").lower()
    return GpuIdentity(ordinal, name, uuid.ljust(16, b"\0"), bus)


def visible_devices() -> list[GpuIdentity]:
    """Every device this process sees, in CUDA's order (what `coppelius node` runs on)."""
    count = init_driver()
    return [identity_of(i, device_handle(i, count)) for i in range(count)]


class Device:
    """Device `ordinal` (among the visible ones) with its primary context made current."""

    def __init__(self, ordinal: int = 0):
        d = cu()
        count = init_driver()
        self.ordinal = ordinal
        self.handle = device_handle(ordinal, count)
        self.identity = identity_of(ordinal, self.handle)
        self.driver_version = int(check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
        self.name = self.identity.name
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
