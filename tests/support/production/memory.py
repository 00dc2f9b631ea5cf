"""The memory a production launch runs on: every buffer (and staging) a full-size, lazily
allocated mapping with guards either side, so each BufferRef offset is honoured as on the GPU
(the pointer is base + offset) while only the pages a case touches cost memory; and the element
runs and byte intervals the harness poisons and compares."""
from __future__ import annotations

import itertools
import math
import mmap
from dataclasses import dataclass

import numpy as np

from coppelius.plan import launches

SPACE_GUARD_BYTES = 64 * 1024   # mapped, watched bytes before and after every buffer
GUARD_ELEMENTS = 4096           # watched elements either side of a region of a large buffer
WATCH_WHOLE_BYTES = 64 << 20    # buffers up to this size are poisoned and watched whole
NP_DTYPES = {"fp32": np.float32, "bf16": np.uint16, "i32": np.int32, "u32": np.uint32}


class Space:
    """One buffer (or the staging region) as a lazily allocated mapping with guards either side."""

    def __init__(self, name: str, nbytes: int, poison: int, spec=None):
        self.name, self.nbytes, self.poison, self.spec = name, nbytes, poison, spec
        self.base = SPACE_GUARD_BYTES
        self.total = SPACE_GUARD_BYTES + nbytes + SPACE_GUARD_BYTES
        self._map = mmap.mmap(-1, self.total)       # zero pages until touched
        self.bytes = np.frombuffer(self._map, np.uint8)
        self.inputs: list[tuple[int, int]] = []     # absolute byte intervals written by setup
        self.watch: list[tuple[int, int]] = []      # absolute byte intervals poisoned and compared
        self.saved: list[tuple[int, int, np.ndarray]] = []   # input bytes as setup left them

    def where(self, b: int) -> str:
        """A byte offset for people: the buffer element (and index in its shape) or the guard."""
        off = b - self.base
        if off < 0:
            return f"{self.name} front guard, {-off} bytes before the base"
        if off >= self.nbytes:
            return f"{self.name} back guard, {off - self.nbytes} bytes past the end"
        if self.spec is None:
            return f"{self.name} byte {off:#x}"
        item = launches.DTYPE_BYTES[self.spec.dtype]
        return (f"{self.name} element {off // item} "
                f"{tuple(int(i) for i in np.unravel_index(off // item, self.spec.shape))}")


@dataclass
class Output:
    """An output region a launch's programs own, in the logical shape the kernel addresses."""
    arg: str
    shape: tuple[int, ...]
    tol: object                 # harness.Tol
    space: Space
    start: int                  # absolute byte offset of the logical region's first element
    dtype: str
    at: int = 0                 # elements past the argument's pointer (a P/M/V plane behind it)

    @property
    def itemsize(self) -> int:
        return launches.DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def runs(shape, index):
    """Flat element runs [start, stop) of `index` (ints and unit-step slices) in a C-order shape."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > len(shape):
        raise IndexError(f"index {index} has more axes than shape {shape}")
    index = index + (slice(None),) * (len(shape) - len(index))
    ranges = []
    for dim, ix in zip(shape, index):
        if isinstance(ix, slice):
            start, stop, step = ix.indices(dim)
            if step != 1:
                raise IndexError(f"index {index}: only unit-step slices")
        else:
            start, stop = int(ix), int(ix) + 1
            if not 0 <= start < dim:
                raise IndexError(f"index {index} outside shape {shape}")
        ranges.append((start, max(start, stop)))
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    lo, hi = ranges[-1]
    if hi == lo:
        return
    for lead in itertools.product(*(range(a, b) for a, b in ranges[:-1])):
        base = sum(i * s for i, s in zip(lead, strides))
        yield base + lo, base + hi


def byte_runs(out: Output, index):
    """Absolute byte intervals of `index` of output `out`."""
    for s, e in runs(out.shape, index):
        yield out.start + s * out.itemsize, out.start + e * out.itemsize


def merge(intervals):
    """Sorted, overlapping or touching intervals joined."""
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [tuple(x) for x in out]
