"""Checkpoint publication (CONTRACT §10): the payload streamed into a temporary, renamed over it.

An exclusively created temporary in the path's directory, payload chunks hashed and written while
the next chunk is read, the header (chunk digests + header digest) written last, fsync (the
whole-file SHA-256 is computed from the page cache meanwhile), rename over the path, fsync of the
directory.  The path holds a complete checkpoint at every instant.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat as stat_mod
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from coppelius.staging import paths

from coppelius.checkpoints.format import HEADER_BYTES, Header
from coppelius.checkpoints.chunks import (RING, ReadChunk, aligned, describe, pread_exact, pwrite_all,
                            sha256, transfer_view)
from coppelius.staging.errors import UserError

TEMP_MARK = ".tmp."             # temporaries are ".<name>.tmp.<pid>.<random>" beside the path
_TEMP_TAIL = re.compile(r"(\d+)\.[0-9a-f]{8}")     # "<pid>.<random>" after TEMP_MARK

_WRITE_HINT = "check the filesystem holding the checkpoint path"
_WRITE_HINTS = {
    errno.ENOSPC: "free space on the filesystem holding the checkpoint path",
    errno.EDQUOT: "free space or raise the disk quota for the checkpoint path",
    errno.EFBIG: "raise the file size limit (ulimit -f) or the filesystem's file size limit",
    errno.ENOENT: "create the checkpoint's directory first",
    errno.EACCES: "choose a checkpoint path in a writable directory",
    errno.EROFS: "choose a checkpoint path on a writable filesystem",
}


class CheckpointWriteFailed(UserError):
    """Publication failed (full disk, file size limit, permissions): the message says at which
    stage and whether the previous checkpoint is intact; `errno` and `stage` ("writing chunk 1
    of 2") say it in short for the error notifier."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None,
                 stage: str = ""):
        super().__init__(message, hint)
        self.errno, self.stage = errno, stage


@dataclass(frozen=True)
class Published:
    path: str
    sha256: bytes               # SHA-256 of the whole published file (the status block's field)
    bytes: int
    seconds: float
    update_count: int


# ------------------------------------------------------------------------------ temporaries

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temporary_prefix(path: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}{TEMP_MARK}")


def stale_temporaries(path) -> list[str]:
    """Temporaries beside `path` left by publishing processes that no longer exist."""
    prefix = _temporary_prefix(os.fspath(path))
    directory, head = os.path.split(prefix)
    stale = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if not entry.name.startswith(head):
                continue
            m = _TEMP_TAIL.fullmatch(entry.name[len(head):])
            if m and int(m[1]) != os.getpid() and not _pid_alive(int(m[1])):
                stale.append(entry.path)
    return stale


class _Temporary:
    """The temporary one publication writes, and the stage it is at: a failure's message names
    the stage and what the path holds after it."""

    def __init__(self, path: str):
        self.path = path
        self.name = f"{_temporary_prefix(path)}{os.getpid()}.{secrets.token_hex(4)}"
        self.fd = -1
        self.stage = "creating the temporary"
        self.renamed = False

    def create(self) -> None:
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(self.fd, stat_mod.S_IMODE(os.stat(self.path).st_mode))   # keep the mode

    def put_in_place(self) -> None:
        """Close, rename over the path, sync the directory."""
        os.close(self.fd)
        self.fd = -1
        self.stage = "renaming the temporary over the path"
        os.replace(self.name, self.path)
        self.renamed = True
        self.stage = "syncing the directory"
        paths.fsync_directory(os.path.dirname(os.path.abspath(self.path)), strict=True)

    def failed(self, e: OSError) -> CheckpointWriteFailed:
        if self.renamed:
            state = "the new checkpoint is in place but may not be durable"
        elif os.path.lexists(self.path):
            state = "the previous checkpoint is intact"
        else:
            state = "nothing was written to the path"
        return CheckpointWriteFailed(f"{describe(self.path)}: publication failed {self.stage}: "
                                     f"{paths.errno_text(e)} ({state})",
                                     _WRITE_HINTS.get(e.errno, _WRITE_HINT), e.errno, self.stage)

    def clean_up(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if not self.renamed:
            with contextlib.suppress(OSError):
                os.unlink(self.name)


# ------------------------------------------------------------------------------ publication

def publish_chunks(path, profile, update_count: int, read_chunk: ReadChunk,
                   transfer=None) -> Published:
    """Publish a checkpoint whose payload bytes [offset, offset+nbytes) `read_chunk` writes into
    `out` (nbytes long, a view of the transfer buffer).  Raises CheckpointWriteFailed on an I/O
    error, leaving the previous checkpoint at `path` untouched."""
    t0 = time.perf_counter()
    path = os.fspath(path)
    window = transfer_view(transfer, profile.chunk_bytes)
    if not 0 <= update_count < 2 ** 64:
        raise ValueError(f"update count {update_count} does not fit u64")

    for leftover in stale_temporaries(path):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    tmp = _Temporary(path)
    try:
        tmp.create()
        file_hash = _write_temporary(tmp, profile, update_count, read_chunk, window)
        tmp.put_in_place()
    except OSError as e:
        raise tmp.failed(e) from e
    finally:
        tmp.clean_up()
    return Published(path=path, sha256=file_hash.digest(),
                     bytes=HEADER_BYTES + profile.payload_bytes,
                     seconds=time.perf_counter() - t0, update_count=update_count)


def _write_temporary(tmp: _Temporary, profile, update_count: int, read_chunk: ReadChunk,
                     window: np.ndarray | None):
    """Payload, header, fsync; returns the whole file's running SHA-256."""
    ring = [aligned(profile.chunk_bytes) for _ in range(RING)]
    # on an error, leaving this `with` waits for the writes in flight before fd closes
    with ThreadPoolExecutor(2, thread_name_prefix="ckpt-publish") as pool:
        digests = _write_payload(tmp, profile, read_chunk, window, ring, pool)
        tmp.stage = "writing the header"
        header = Header.for_profile(profile, update_count, digests).encode()
        pwrite_all(tmp.fd, header, 0)
        # fsync (disk-bound, no GIL) runs while the whole file is hashed from the page cache
        tmp.stage = "syncing the temporary"
        synced = pool.submit(os.fsync, tmp.fd)
        file_hash = hashlib.sha256(header)
        for i, (offset, nbytes) in enumerate(_chunk_spans(profile)):
            buf = ring[i % RING][:nbytes]
            if pread_exact(tmp.fd, buf, HEADER_BYTES + offset) != nbytes:
                raise OSError(errno.EIO, "temporary shrank while being published")
            file_hash.update(buf)
        synced.result()
    return file_hash


def _chunk_spans(profile) -> list[tuple[int, int]]:
    """(payload offset, bytes) of each chunk, in order."""
    chunk_bytes, total = profile.chunk_bytes, profile.payload_bytes
    return [(i * chunk_bytes, min(chunk_bytes, total - i * chunk_bytes))
            for i in range(profile.chunk_count)]


def _write_payload(tmp: _Temporary, profile, read_chunk: ReadChunk, window, ring,
                   pool) -> list[bytes]:
    """Every chunk read into a ring slot, then hashed and written by the pool while the next is
    read; returns the chunk digests in order."""
    n = profile.chunk_count
    digests: list[bytes] = []
    in_flight: list = [None] * RING        # (chunk index, hash future, write future)

    def settle(slot: int) -> None:
        if in_flight[slot] is None:
            return
        index, hashed, written = in_flight[slot]
        in_flight[slot] = None
        tmp.stage = f"writing chunk {index + 1} of {n}"
        written.result()
        digests.append(hashed.result())

    for i, (offset, nbytes) in enumerate(_chunk_spans(profile)):
        slot = i % RING
        settle(slot)
        buf = ring[slot][:nbytes]
        tmp.stage = f"reading chunk {i + 1} of {n}"
        if window is None:
            read_chunk(offset, nbytes, buf)
        else:
            read_chunk(offset, nbytes, window[:nbytes])
            np.copyto(buf, window[:nbytes])         # frees the window for the next read
        in_flight[slot] = (i, pool.submit(sha256, buf),
                           pool.submit(pwrite_all, tmp.fd, buf, HEADER_BYTES + offset))
    for k in range(n, n + RING):
        settle(k % RING)
    return digests


def _planes_as_bytes(profile, P, M, V) -> list[np.ndarray]:
    out = []
    for name, plane in zip("PMV", (P, M, V)):
        arr = np.ascontiguousarray(plane)
        if arr.dtype != np.dtype("<f4") or arr.size != profile.parameter_count:
            raise ValueError(f"{name} plane must be {profile.parameter_count} little-endian "
                             f"float32 values, is {arr.size} × {arr.dtype}")
        out.append(arr.reshape(-1).view(np.uint8))
    return out


def publish(path, profile, P, M, V, update_count: int, transfer=None) -> Published:
    """Publish numpy planes (each `parameter_count` float32)."""
    planes = _planes_as_bytes(profile, P, M, V)
    plane_bytes = planes[0].size

    def read_chunk(offset: int, nbytes: int, out: np.ndarray) -> None:
        done = 0
        while done < nbytes:                        # a chunk may straddle two planes
            plane, start = divmod(offset + done, plane_bytes)
            take = min(nbytes - done, plane_bytes - start)
            out[done:done + take] = planes[plane][start:start + take]
            done += take

    return publish_chunks(path, profile, update_count, read_chunk, transfer)
