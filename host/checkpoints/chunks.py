"""The chunk I/O both checkpoint directions share: aligned ring buffers, the transfer buffer's view,
whole positional reads and writes, hashing off the GIL."""
from __future__ import annotations

import hashlib
import os
from typing import Callable

import numpy as np

RING = 3                        # chunk buffers in flight: one being read, two being hashed/written
BUFFER_ALIGN = 4096

ReadChunk = Callable[[int, int, np.ndarray], None]     # (payload offset, nbytes, out)
WriteChunk = Callable[[int, np.ndarray], None]         # (payload offset, verified bytes)


def describe(path) -> str:
    """How a message names a checkpoint path."""
    return f"checkpoint {os.fspath(path)}"


def aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + BUFFER_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % BUFFER_ALIGN
    return raw[start:start + nbytes]


def transfer_view(transfer, chunk_bytes: int) -> np.ndarray | None:
    """The first `chunk_bytes` of a transfer buffer as writable uint8, or None without one."""
    if transfer is None:
        return None
    arr = transfer if isinstance(transfer, np.ndarray) else np.frombuffer(transfer, np.uint8)
    arr = arr.reshape(-1).view(np.uint8)
    if arr.size < chunk_bytes or not arr.flags.writeable:
        raise ValueError(f"transfer buffer must be writable and hold {chunk_bytes} bytes, "
                         f"has {arr.size}")
    return arr[:chunk_bytes]


def sha256(buf) -> bytes:
    return hashlib.sha256(buf).digest()     # releases the GIL for buffers over 2 KiB


def pwrite_all(fd: int, buf, offset: int) -> None:
    view = memoryview(buf).cast("B")
    while view:                             # a file size limit gives a short write first
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def pread_exact(fd: int, buf: np.ndarray, offset: int) -> int:
    """Fill `buf` from `offset`; returns the bytes read (less only at end of file)."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got
