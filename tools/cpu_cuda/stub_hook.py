"""The executor attached to the C stub libcuda.so.1 (tests/support/stub_cuda/execute.c) through
ctypes: the real cuda-bindings load the stub as the driver, and every Triton launch the stub runs
(an immediate launch or a graph node) is handed to tools/cpu_cuda/executor.py.

    from tools.cpu_cuda import stub_hook
    stub_hook.attach()          # before the first driver call; the stub must be the libcuda.so.1

`attach` loads "libcuda.so.1" by the system search (LD_LIBRARY_PATH naming the stub's build
directory, as tests/support/stub_driver.py sets it): the same library cuda-bindings will find
already loaded.  A process that should compute on the stub from its first line — a `coppelius
node` child — attaches from a `sitecustomize` (tests/support/stub_execute/).
"""
from __future__ import annotations

import ctypes
import sys
import traceback

from tools.cpu_cuda.executor import CUDA_ERROR_LAUNCH_FAILED, Executor, LaunchFailed, Memory, \
    Region

LIBRARY = "libcuda.so.1"
SET_EXECUTOR = "coppelius_stub_set_executor"
MODULE_HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
KERNEL_HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                               ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)


class NotTheStub(RuntimeError):
    """The libcuda.so.1 this process loads is not the stub (no executor entry point)."""


class StubMemory(Memory):
    """The stub's allocations and mapped ranges, asked of the stub (coppelius_stub_region)."""

    def __init__(self, lib):
        self._region = lib.coppelius_stub_region
        self._region.restype = ctypes.c_int
        self._region.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint64)]

    def region(self, device_ptr: int) -> Region | None:
        base, size, host = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_uint64()
        if not self._region(device_ptr, ctypes.byref(base), ctypes.byref(size), ctypes.byref(host)):
            return None
        return Region(base.value, size.value, host.value)


_ATTACHED: list = []            # the executor and the callbacks: alive as long as the process


def attach(library: str = LIBRARY) -> Executor:
    """Load the stub and hand it this process's executor (once; later calls return it)."""
    if _ATTACHED:
        return _ATTACHED[0]
    lib = ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    if not hasattr(lib, SET_EXECUTOR):
        raise NotTheStub(f"{library} has no {SET_EXECUTOR}: it is not tests/support/stub_cuda's "
                         "(LD_LIBRARY_PATH should name the stub's build directory first)")
    executor = Executor(StubMemory(lib))

    def on_module(module, image, n):
        try:
            executor.module_loaded(module, ctypes.string_at(image, n))
        except BaseException:                   # a callback cannot raise into C
            traceback.print_exc(file=sys.stderr)
        return 0

    def on_kernel(module, entry, grid, params, nbytes, sequence, corrupt, report, report_n):
        def answer(code: int, text: str) -> int:
            data = text.encode(errors="replace")[:max(report_n - 1, 0)]
            ctypes.memmove(report, data + b"\0", len(data) + 1)
            return code
        try:
            e = executor.entry(module, entry.decode())
            if e is None:
                return answer(CUDA_ERROR_LAUNCH_FAILED, f"{entry.decode()}: no committed manifest "
                              "entry has this module's PTX (kernels_ptx/*/*/manifest.json)")
            values = e.decode(ctypes.string_at(params, nbytes))
            executor.launch(e, (grid[0], grid[1], grid[2]), values, corrupt=bool(corrupt))
            return 0
        except LaunchFailed as failed:
            return answer(failed.code, failed.report)
        except BaseException as exc:            # a callback cannot raise into C
            traceback.print_exc(file=sys.stderr)
            return answer(CUDA_ERROR_LAUNCH_FAILED, f"the executor raised {exc!r}")

    hooks = (MODULE_HOOK(on_module), KERNEL_HOOK(on_kernel))
    getattr(lib, SET_EXECUTOR)(*hooks)
    _ATTACHED.extend([executor, lib, hooks])
    return executor
