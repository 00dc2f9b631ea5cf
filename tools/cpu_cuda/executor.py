"""The CPU drivers' kernel executor: a launch the host handed a driver, run by Triton's interpreter.

Its only inputs are what the host passed to the driver: the PTX image it loaded (identified by its
sha256 in the committed manifests, kernels_ptx/<profile>/<target>/manifest.json, which name the
Triton function, its module, its constexprs and its parameters), the launch's grid, its packed
parameter values (the bytes behind the `void**` array) and the device memory the driver allocated.
Nothing of the plan's launch lists is consulted.  A driver (tools/fake_driver.py, the C stub of
tests/support/stub_cuda/ through tools/cpu_cuda/stub_hook.py) hands in a `Memory`, which says which
live allocation or mapped range holds a device address and where its bytes are on the host.

What a GPU would not report, checked here:
  * a parameter the manifest lists in `divisible_by_16` (the PTX was specialized on it) whose
    value is not: the launch fails naming the kernel and the parameter
    (CUDA_ERROR_MISALIGNED_ADDRESS for a pointer, CUDA_ERROR_INVALID_VALUE for an integer), where
    a GPU would compute wrong;
  * every load and store's unmasked lanes must lie inside the allocation (or mapped range) the
    pointer parameter it was derived from points into, as compute-sanitizer's memcheck would
    check: otherwise CUDA_ERROR_ILLEGAL_ADDRESS with the kernel, the parameter and the offset.
Provenance is exact: each pointer parameter enters the interpreter as its host address with the
parameter's index in the top byte (user-space addresses stay below 2^48, and a kernel's offsets
never carry into it), which every load and store decodes.

The arithmetic is the interpret backend's (coppelius.backends.interpret repairs the interpreter),
so a cuda run on a CPU driver gives the interpret backend's bits: tests/host/backends/
test_cuda_executed.py holds the two to each other byte for byte.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import coppelius.backends.interpret  # noqa: F401  (TRITON_INTERPRET=1 and the repaired interpreter)
import triton.language as tl
from triton.runtime import interpreter as _interp

from coppelius import kernels_ptx

# CUresult codes the executor fails a launch with (cuda.h)
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_MISALIGNED_ADDRESS = 716
CUDA_ERROR_LAUNCH_FAILED = 719

TAG_SHIFT = 56                       # a pointer's parameter index + 1 lives in its top byte
ADDRESS_MASK = np.uint64((1 << TAG_SHIFT) - 1)
DIVISOR = 16                         # Triton's `divisible_by_16` specialization
MANIFEST = "manifest.json"
SCALAR_TYPES = {                     # manifest type → (bytes, numpy type, Triton type)
    "i1": (1, np.int8, tl.int1), "i8": (1, np.int8, tl.int8), "i16": (2, np.int16, tl.int16),
    "i32": (4, np.int32, tl.int32), "i64": (8, np.int64, tl.int64),
    "u8": (1, np.uint8, tl.uint8), "u16": (2, np.uint16, tl.uint16),
    "u32": (4, np.uint32, tl.uint32), "u64": (8, np.uint64, tl.uint64),
    "fp16": (2, np.float16, tl.float16), "bf16": (2, np.uint16, tl.bfloat16),
    "fp32": (4, np.float32, tl.float32), "fp64": (8, np.float64, tl.float64),
}
POINTER_BYTES = 8


class LaunchFailed(Exception):
    """A launch the executor refuses or that faults: the CUresult a device would return and the
    report a sanitizer would print (kernel, parameter, offset)."""

    def __init__(self, code: int, report: str):
        super().__init__(report)
        self.code = code
        self.report = report


@dataclass(frozen=True)
class Region:
    """One live allocation or mapped range: its device address, size, and its host address."""
    device: int
    size: int
    host: int


class Memory:
    """What a driver tells the executor about its memory (the drivers subclass it)."""

    def region(self, device_ptr: int) -> Region | None:      # pragma: no cover - an interface
        raise NotImplementedError


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    hidden: bool

    @property
    def pointer(self) -> bool:
        return self.type.startswith("*")

    @property
    def nbytes(self) -> int:
        return POINTER_BYTES if self.pointer else SCALAR_TYPES[self.type][0]


@dataclass(frozen=True)
class KernelEntry:
    """A committed manifest entry: what the PTX was built from."""
    key: str
    where: str                       # profile/target, for messages
    module: str
    function: str
    constexprs: dict
    params: tuple[Param, ...]
    divisible_by_16: frozenset

    @classmethod
    def from_record(cls, key: str, where: str, k: dict) -> "KernelEntry":
        params = tuple(Param(p["name"], p["type"], bool(p["hidden"])) for p in k["params"])
        return cls(key, where, k["module"], k["function"], dict(k["constexprs"]), params,
                   frozenset(k.get("divisible_by_16", ())))

    def decode(self, blob: bytes) -> list:
        """The parameters' values from their packed bytes (each at its natural size, in order)."""
        values, at = [], 0
        for p in self.params:
            raw = blob[at:at + p.nbytes]
            if len(raw) != p.nbytes:
                raise LaunchFailed(CUDA_ERROR_INVALID_VALUE, f"{self.key}: {len(blob)} parameter "
                                   f"bytes, the manifest's parameters need more ({p.name})")
            dtype = np.uint64 if p.pointer else SCALAR_TYPES[p.type][1]
            values.append(np.frombuffer(raw, dtype)[0].item())
            at += p.nbytes
        return values


def manifest_index(root: Path | None = None) -> dict[str, list[KernelEntry]]:
    """Every committed manifest entry by the sha256 of its PTX file."""
    root = root or Path(kernels_ptx.__file__).resolve().parent
    index: dict[str, list[KernelEntry]] = {}
    for path in sorted(root.glob(f"*/*/{MANIFEST}")):
        where = f"{path.parent.parent.name}/{path.parent.name}"
        for key, k in json.loads(path.read_text())["kernels"].items():
            index.setdefault(k["sha256"], []).append(KernelEntry.from_record(key, where, k))
    return index


def image_sha256(image: bytes) -> str:
    """A module image's digest as the manifest records it (the file's bytes: up to a NUL)."""
    return hashlib.sha256(image.split(b"\0", 1)[0]).hexdigest()


@dataclass
class _Launch:
    """The launch running now: its kernel, its pointer parameters by tag, the first store."""
    entry: KernelEntry
    pointers: dict = field(default_factory=dict)      # tag → (Param, device value, Region | None)
    record_store: bool = False                        # remember the first store (to corrupt it)
    first_store: int | None = None                    # host address of the first stored element


class Executor:
    """Runs the Triton launches a CPU driver receives (one process, one executor)."""

    def __init__(self, memory: Memory, index: dict | None = None, report=None):
        self.memory = memory
        self.index = manifest_index() if index is None else index
        self.modules: dict = {}                 # driver module handle → [KernelEntry] by entry
        self.report = report or (lambda text: print(text, file=sys.stderr, flush=True))
        self.launches = 0
        _install_checked_memory_access()

    def module_loaded(self, handle, image: bytes) -> None:
        """Remember which manifest entries a loaded module is (none: not a Triton kernel of ours,
        e.g. the hand-written release PTX, which its driver runs itself)."""
        self.modules[handle] = self.index.get(image_sha256(image), [])

    def entry(self, module, name: str) -> KernelEntry | None:
        """The manifest entry of a loaded module's function `name`, or None when it is not one."""
        found = [e for e in self.modules.get(module, ()) if e.function == name]
        distinct = {(e.module, e.function, json.dumps(e.constexprs, sort_keys=True))
                    for e in found}
        if len(distinct) > 1:
            raise LaunchFailed(CUDA_ERROR_LAUNCH_FAILED, f"{name}: the module's PTX is in several "
                               f"manifests with different constexprs ({[e.where for e in found]})")
        return found[0] if found else None

    def launch(self, entry: KernelEntry, grid: tuple[int, int, int], values: list,
               corrupt: bool = False) -> None:
        """Run one launch on the CPU; raises LaunchFailed (and reports it) on a refusal or a
        fault.  `corrupt`: flip bit 0 of the first element the launch stores (a faulty GPU)."""
        try:
            self._launch(entry, tuple(int(g) for g in grid), values, corrupt)
        except LaunchFailed as e:
            self.report(e.report)
            raise

    def _launch(self, entry: KernelEntry, grid, values, corrupt: bool) -> None:
        if len(values) != len(entry.params):
            raise LaunchFailed(CUDA_ERROR_INVALID_VALUE, f"{entry.key}: {len(values)} parameter "
                               f"values, the manifest lists {len(entry.params)}")
        for p, v in zip(entry.params, values):
            if p.name in entry.divisible_by_16 and int(v) % DIVISOR:
                kind = "pointer" if p.pointer else "integer"
                raise LaunchFailed(
                    CUDA_ERROR_MISALIGNED_ADDRESS if p.pointer else CUDA_ERROR_INVALID_VALUE,
                    f"coppelius cpu driver: {entry.key} ({entry.where}): parameter {p.name} = "
                    f"{int(v):#x} is not divisible by {DIVISOR}, and the PTX was specialized on "
                    f"it (manifest `divisible_by_16`): a GPU would compute with a wrong {kind}")
        launch = _Launch(entry, record_store=corrupt)
        args = []
        for p, v in zip(entry.params, values):
            if p.hidden:
                continue
            if p.pointer:
                tag = len(launch.pointers) + 1
                region = self.memory.region(int(v)) if v else None
                launch.pointers[tag] = (p, int(v), region)
                host = region.host + (int(v) - region.device) if region else 0
                ty = tl.pointer_type(SCALAR_TYPES[p.type[1:]][2])
                handle = _interp.TensorHandle(np.array([(tag << TAG_SHIFT) | host], np.uint64), ty)
                args.append(tl.tensor(handle, ty))
            else:
                _, np_type, ty = SCALAR_TYPES[p.type]
                args.append(tl.tensor(_interp.TensorHandle(np.array([v], np_type), ty), ty))
        fn = getattr(importlib.import_module(entry.module), entry.function)
        _RUNNING.append(launch)
        try:
            fn[grid](*args, **entry.constexprs)
        except Exception as exc:               # the interpreter wraps what a load or store raised
            cause = exc
            while cause is not None and not isinstance(cause, LaunchFailed):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:
                raise cause from None
            raise LaunchFailed(CUDA_ERROR_LAUNCH_FAILED,
                               f"coppelius cpu driver: {entry.key}: {exc}") from exc
        finally:
            _RUNNING.pop()
        self.launches += 1
        if corrupt and launch.first_store is not None:
            ctypes.c_uint8.from_address(launch.first_store).value ^= 1


_RUNNING: list[_Launch] = []


def _check(launch: _Launch, ptrs: np.ndarray, mask: np.ndarray, itemsize: int, kind: str):
    """The host addresses of `ptrs` (tags removed) once every unmasked lane lies in its
    parameter's region; else LaunchFailed as memcheck would report it.  One gather and two
    reductions when the live lanes come from one parameter (nearly every access: a tag is the
    top byte, so equal tags at the minimum and the maximum mean one tag throughout)."""
    addresses = ptrs & ADDRESS_MASK
    live = ptrs[np.broadcast_to(mask, ptrs.shape)] if mask is not None else ptrs.reshape(-1)
    if live.size == 0:
        return addresses
    low, high = int(live.min()), int(live.max())
    if low >> TAG_SHIFT == high >> TAG_SHIFT:
        groups = [(low >> TAG_SHIFT, low & int(ADDRESS_MASK), high & int(ADDRESS_MASK), None)]
    else:
        tags = live >> np.uint64(TAG_SHIFT)
        groups = []
        for tag in np.unique(tags):
            mine = live[tags == tag] & ADDRESS_MASK
            groups.append((int(tag), int(mine.min()), int(mine.max()), mine))
    for tag, lo, hi, lanes in groups:
        if tag not in launch.pointers:
            raise LaunchFailed(CUDA_ERROR_ILLEGAL_ADDRESS, (
                f"coppelius cpu driver: invalid {kind} of {itemsize} bytes in {launch.entry.key} "
                f"({launch.entry.where}): address {lo:#x} comes from no pointer parameter"))
        p, value, region = launch.pointers[tag]
        if region is not None and lo >= region.host and hi <= region.host + region.size - itemsize:
            continue
        if lanes is None:
            lanes = live[(live >> np.uint64(TAG_SHIFT)) == tag] & ADDRESS_MASK
        a = lanes.astype(np.int64)
        start, end = (region.host, region.host + region.size - itemsize) if region else (0, -1)
        bad = int(a[(a < start) | (a > end)].flat[0])
        if region is not None:
            where = (f"offset {bad - (value - region.device + region.host):+d} bytes from "
                     f"{p.name} ({value:#x}), outside its allocation of {region.size:,} bytes at "
                     f"{region.device:#x}")
        else:
            where = f"{p.name} = {value:#x} is in no live allocation (offset {bad - start:+d})"
        raise LaunchFailed(CUDA_ERROR_ILLEGAL_ADDRESS, (
            f"coppelius cpu driver: invalid {kind} of {itemsize} bytes in {launch.entry.key} "
            f"({launch.entry.where}), parameter {p.name}: {where} "
            f"(CUDA_ERROR_ILLEGAL_ADDRESS, as compute-sanitizer's memcheck)"))
    return addresses


def _install_checked_memory_access() -> None:
    """Every load and store of a launch the executor runs goes through `_check` (others — the
    interpret backend's launches in the same process — go straight through)."""
    builder = _interp.InterpreterBuilder
    if getattr(builder, "_coppelius_checked", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def checked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        if not _RUNNING:
            return load(self, ptrs, mask, other, cache_policy, is_volatile)
        launch = _RUNNING[-1]
        itemsize = _interp._get_np_dtype(ptrs.get_element_ty()).itemsize
        plain = _check(launch, ptrs.data, mask.data, itemsize, "global read")
        return load(self, _interp.TensorHandle(plain, ptrs.dtype), mask, other, cache_policy,
                    is_volatile)

    def checked_store(self, ptrs, value, mask, cache_policy):
        if not _RUNNING:
            return store(self, ptrs, value, mask, cache_policy)
        launch = _RUNNING[-1]
        itemsize = _interp._get_np_dtype(ptrs.get_element_ty()).itemsize
        plain = _check(launch, ptrs.data, mask.data, itemsize, "global write")
        if launch.record_store and launch.first_store is None:
            lanes = np.flatnonzero(np.broadcast_to(mask.data, plain.shape))
            if lanes.size:
                launch.first_store = int(plain.reshape(-1)[lanes[0]])
        return store(self, _interp.TensorHandle(plain, ptrs.dtype), value, mask, cache_policy)

    builder.create_masked_load = checked_load
    builder.create_masked_store = checked_store
    builder._coppelius_checked = True
