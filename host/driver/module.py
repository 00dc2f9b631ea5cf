"""PTX modules and kernels: the driver's JIT loads the committed PTX, a kernel launches it.

The host never compiles.  Every driver return goes through host/driver/calls.py's `check()`
(`release()` on a close path).
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from coppelius.errors import BackendUnavailable
from coppelius.driver.calls import check, cu, error_name, release
from coppelius.driver.stream import Stream

JIT_LOG_BYTES = 64 * 1024       # each of the JIT's info and error logs
STATIC_SHARED_LIMIT = 48 * 1024  # dynamic shared memory beyond this needs the per-function opt-in


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
                             "for its predecessor; hint: rebuild the PTX (python -m tools.build_ptx)")
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
