"""Checkpoint I/O (SPEC §10): atomic publication, verified streaming load, the per-path lock.

The streaming cores are `publish_chunks` and `load_chunks`: payload bytes (P, M, V planes, fp32
LE, concatenated) pass chunk by chunk through a transfer buffer (the staging window on the cuda
backend), so the planes may live on the device.  `publish`/`load` wrap them for numpy planes.

Publication: an exclusively created temporary in the path's directory, payload chunks hashed and
written while the next chunk is read, the header (chunk digests + header digest) written last,
fsync (the whole-file SHA-256 is computed from the page cache meanwhile), rename over the path,
fsync of the directory.  The path holds a complete checkpoint at every instant.

Loading: the header, identities and sizes are checked before the first chunk is read; every
chunk's digest is checked before the chunk is handed on; the payload is never held twice.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shlex
import stat as stat_mod
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from plan import profiles
from staging import paths

from .checkpoint_format import (HEADER_BYTES, CheckpointLocked, CheckpointRefused, Header,
                                check_profile)
from .errors import UserError

__all__ = ["CheckpointRefused", "CheckpointLocked", "CheckpointWriteFailed", "Published",
           "Loaded", "InputCheckpoint", "publish_chunks", "publish", "load_chunks", "load",
           "open_input", "lock", "LOCK_SUFFIX"]

LOCK_SUFFIX = ".lock"
TEMP_MARK = ".tmp."             # temporaries are ".<name>.tmp.<pid>.<random>" beside the path
_TEMP_TAIL = re.compile(r"(\d+)\.[0-9a-f]{8}")     # "<pid>.<random>" after TEMP_MARK
RING = 3                        # chunk buffers in flight: one being read, two being hashed/written
BUFFER_ALIGN = 4096


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


@dataclass(frozen=True)
class Loaded:
    update_count: int
    payload_sha256: bytes       # SHA-256 of the whole payload (the stat record's field)
    stat: os.stat_result        # fstat of the opened file
    seconds: float
    header: Header


ReadChunk = Callable[[int, int, np.ndarray], None]     # (payload offset, nbytes, out)
WriteChunk = Callable[[int, np.ndarray], None]         # (payload offset, verified bytes)


# ---------------------------------------------------------------------------------- helpers

def _where(path) -> str:
    return f"checkpoint {os.fspath(path)}"


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + BUFFER_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % BUFFER_ALIGN
    return raw[start:start + nbytes]


def _transfer_view(transfer, chunk_bytes: int) -> np.ndarray | None:
    if transfer is None:
        return None
    arr = transfer if isinstance(transfer, np.ndarray) else np.frombuffer(transfer, np.uint8)
    arr = arr.reshape(-1).view(np.uint8)
    if arr.size < chunk_bytes or not arr.flags.writeable:
        raise ValueError(f"transfer buffer must be writable and hold {chunk_bytes} bytes, "
                         f"has {arr.size}")
    return arr[:chunk_bytes]


def _sha256(buf) -> bytes:
    return hashlib.sha256(buf).digest()     # releases the GIL for buffers over 2 KiB


def _pwrite_all(fd: int, buf, offset: int) -> None:
    view = memoryview(buf).cast("B")
    while view:                             # a file size limit gives a short write first
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _pread_exact(fd: int, buf: np.ndarray, offset: int) -> int:
    """Fill `buf` from `offset`; returns the bytes read (less only at end of file)."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


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


def _plane_label(profile, offset: int) -> str:
    """'P plane, embed' for a payload byte offset."""
    plane_bytes = profile.parameter_count * profiles.BYTES_PER_SCALAR
    plane, element = divmod(offset, plane_bytes)
    element //= profiles.BYTES_PER_SCALAR
    name = next(p.name for p in profile.parameters if p.offset <= element < p.end)
    return f"{'PMV'[plane]} plane, {name}"


# ------------------------------------------------------------------------------ publication

def publish_chunks(path, profile, update_count: int, read_chunk: ReadChunk,
                   transfer=None) -> Published:
    """Publish a checkpoint whose payload bytes [offset, offset+nbytes) `read_chunk` writes into
    `out` (nbytes long, a view of the transfer buffer).  Raises CheckpointWriteFailed on an I/O
    error, leaving the previous checkpoint at `path` untouched."""
    t0 = time.perf_counter()
    path = os.fspath(path)
    where = _where(path)
    chunk_bytes, total, n = profile.chunk_bytes, profile.payload_bytes, profile.chunk_count
    window = _transfer_view(transfer, chunk_bytes)
    if not 0 <= update_count < 2 ** 64:
        raise ValueError(f"update count {update_count} does not fit u64")

    for leftover in stale_temporaries(path):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    tmp = f"{_temporary_prefix(path)}{os.getpid()}.{secrets.token_hex(4)}"
    stage = "creating the temporary"
    fd = -1
    renamed = False
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(fd, stat_mod.S_IMODE(os.stat(path).st_mode))   # keep the path's mode
        ring = [_aligned(chunk_bytes) for _ in range(RING)]
        digests: list[bytes] = []
        with ThreadPoolExecutor(2, thread_name_prefix="ckpt-publish") as pool:
            in_flight: list = [None] * RING        # (chunk index, hash future, write future)

            def settle(slot: int) -> None:
                nonlocal stage
                if in_flight[slot] is None:
                    return
                index, hashed, written = in_flight[slot]
                in_flight[slot] = None
                stage = f"writing chunk {index + 1} of {n}"
                written.result()
                digests.append(hashed.result())

            # on an error, leaving this `with` waits for the writes in flight before fd closes
            for i in range(n):
                slot = i % RING
                settle(slot)
                offset = i * chunk_bytes
                nbytes = min(chunk_bytes, total - offset)
                buf = ring[slot][:nbytes]
                stage = f"reading chunk {i + 1} of {n}"
                if window is None:
                    read_chunk(offset, nbytes, buf)
                else:
                    read_chunk(offset, nbytes, window[:nbytes])
                    np.copyto(buf, window[:nbytes])         # frees the window for the next read
                in_flight[slot] = (i, pool.submit(_sha256, buf),
                                   pool.submit(_pwrite_all, fd, buf, HEADER_BYTES + offset))
            for k in range(n, n + RING):
                settle(k % RING)
            stage = "writing the header"
            header = Header.for_profile(profile, update_count, digests).encode()
            _pwrite_all(fd, header, 0)
            # fsync (disk-bound, no GIL) runs while the whole file is hashed from the page cache
            stage = "syncing the temporary"
            synced = pool.submit(os.fsync, fd)
            file_hash = hashlib.sha256(header)
            for i in range(n):
                offset, nbytes = i * chunk_bytes, min(chunk_bytes, total - i * chunk_bytes)
                buf = ring[i % RING][:nbytes]
                if _pread_exact(fd, buf, HEADER_BYTES + offset) != nbytes:
                    raise OSError(errno.EIO, "temporary shrank while being published")
                file_hash.update(buf)
            synced.result()
        os.close(fd)
        fd = -1
        stage = "renaming the temporary over the path"
        os.replace(tmp, path)
        renamed = True
        stage = "syncing the directory"
        paths.fsync_directory(os.path.dirname(os.path.abspath(path)), strict=True)
    except OSError as e:
        if renamed:
            state = "the new checkpoint is in place but may not be durable"
        elif os.path.lexists(path):
            state = "the previous checkpoint is intact"
        else:
            state = "nothing was written to the path"
        raise CheckpointWriteFailed(f"{where}: publication failed {stage}: "
                                    f"{paths.errno_text(e)} ({state})",
                                    _WRITE_HINTS.get(e.errno, _WRITE_HINT), e.errno, stage) from e
    finally:
        if fd >= 0:
            os.close(fd)
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return Published(path=path, sha256=file_hash.digest(), bytes=HEADER_BYTES + total,
                     seconds=time.perf_counter() - t0, update_count=update_count)


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


# ---------------------------------------------------------------------------------- loading

class InputCheckpoint:
    """A run's checkpoint input, opened once: fresh (zero bytes) or a checked envelope.
    `stat` is the fstat of this fd at open; `restat()` takes it again (for the stat record)."""

    def __init__(self, path: str, profile, fd: int, stat: os.stat_result,
                 header: Header | None):
        self.path, self.profile, self.fd, self.stat, self.header = path, profile, fd, stat, header

    @property
    def fresh(self) -> bool:
        return self.header is None

    @property
    def update_count(self) -> int:
        return 0 if self.header is None else self.header.update_count

    def restat(self) -> os.stat_result:
        return os.fstat(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "InputCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load_chunks(self, write_chunk: WriteChunk, transfer=None) -> Loaded:
        """Stream the payload: each chunk's digest is checked, then the chunk is handed to
        `write_chunk(offset, view)` (the view is reused after the call returns)."""
        return self._stream(write_chunk, transfer)

    def load_into(self, payload: np.ndarray) -> Loaded:
        """Read the payload straight into `payload` (uint8, payload_bytes long), verifying every
        chunk; on a refusal its content is undefined and must be dropped."""
        return self._stream(None, None, payload)

    def _stream(self, write_chunk, transfer, landing: np.ndarray | None = None) -> Loaded:
        t0 = time.perf_counter()
        where = _where(self.path)
        if self.header is None:
            raise CheckpointRefused(f"{where}: file too short: 0 bytes, a zero-byte file "
                                    "starts fresh and holds no checkpoint",
                                    "a fresh run needs no load")
        h, fd, profile = self.header, self.fd, self.profile
        window = _transfer_view(transfer, h.chunk_bytes)
        n = h.chunk_count
        # each slot as large as the largest chunk it holds: a 2-chunk payload never needs more
        # buffer than its own size (a tiny checkpoint: 4 MiB + 1.7 MiB, not 3 × 4 MiB)
        ring = None if landing is not None else \
            [_aligned(max(h.chunk_span(i)[1] for i in range(k, n, RING)))
             for k in range(min(RING, n))]

        def buffer(i: int) -> np.ndarray:
            offset, nbytes = h.chunk_span(i)
            if ring is None:                        # load_into: no ring, no copy
                return landing[offset:offset + nbytes]
            return ring[i % RING][:nbytes]

        payload_hash = hashlib.sha256()
        with ThreadPoolExecutor(2, thread_name_prefix="ckpt-load") as pool:
            def read(i: int):
                return pool.submit(_pread_exact, fd, buffer(i), HEADER_BYTES + h.chunk_span(i)[0])

            reads = {i: read(i) for i in range(min(RING - 1, n))}
            for i in range(n):
                offset, nbytes = h.chunk_span(i)
                with paths.refusing("checkpoint", self.path, "read", CheckpointRefused):
                    got = reads.pop(i).result()
                if i + RING - 1 < n:
                    reads[i + RING - 1] = read(i + RING - 1)   # the slot of chunk i-1, done
                buf = buffer(i)
                if got != nbytes:
                    raise CheckpointRefused(f"{where}: file shrank while loading: chunk {i + 1} "
                                            f"of {n} has {got} of {nbytes} bytes",
                                            "another process is writing the file; retry")
                chunk_digest = pool.submit(_sha256, buf)   # both hashes on their own core
                payload_hash.update(buf)
                digest = chunk_digest.result()
                if digest != h.digests[i]:
                    for f in reads.values():
                        f.cancel()
                    raise CheckpointRefused(
                        f"{where}: chunk {i + 1} of {n} digest differs (payload bytes "
                        f"[{offset}, {offset + nbytes}): {_plane_label(profile, offset)} to "
                        f"{_plane_label(profile, offset + nbytes - 1)}): "
                        f"file {h.digests[i].hex()[:16]}… computed {digest.hex()[:16]}…",
                        "the payload is damaged; restore the checkpoint from a copy, "
                        "or start fresh with `: > PATH`")
                if write_chunk is None:
                    pass
                elif window is None:
                    write_chunk(offset, buf)
                else:
                    np.copyto(window[:nbytes], buf)
                    write_chunk(offset, window[:nbytes])
        return Loaded(update_count=h.update_count, payload_sha256=payload_hash.digest(),
                      stat=self.stat, seconds=time.perf_counter() - t0, header=h)


def read_header(path) -> tuple[Header | None, os.stat_result]:
    """The header of a checkpoint file on its own terms (no profile); None for a zero-byte file."""
    fd, st = _open_or_refuse(path)
    try:
        if st.st_size == 0:
            return None, st
        return Header.decode(_pread_header(fd, path), _where(path)), st
    finally:
        os.close(fd)


def _open_or_refuse(path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a checkpoint path: never blocks (a FIFO is refused, not waited on); every
    OSError is a one-line refusal naming the path and the errno."""
    hints = {errno.ENOENT: f"`: > {shlex.quote(os.fspath(path))}` starts fresh; check the path "
                           "for a typo",
             "not regular": "pass a checkpoint file; a zero-byte file starts fresh"}
    return paths.open_regular(path, "checkpoint", CheckpointRefused, hints)


def _pread_header(fd: int, path) -> bytes:
    with paths.refusing("checkpoint", path, "read", CheckpointRefused):
        return os.pread(fd, HEADER_BYTES, 0)


def _check_size(header: Header, size: int, where: str) -> None:
    expected = header.file_bytes
    if size < expected:
        raise CheckpointRefused(f"{where}: file too short: {size} bytes, header + payload is "
                                f"{expected} ({expected - size} bytes missing)",
                                "the file was cut short (an interrupted copy?); restore it")
    if size > expected:
        raise CheckpointRefused(f"{where}: {size - expected} trailing bytes after the payload "
                                f"(file {size} bytes, header + payload {expected})",
                                "something appended to the file; restore it from a copy")


def open_input(path, profile, name=None) -> InputCheckpoint:
    """Open a run's checkpoint input (SPEC §2): missing → refused; zero bytes → fresh; anything
    else must be an envelope for `profile` (header, identities, sizes checked now).  `name` is
    how later messages call it (the user's spelling of a resolved path)."""
    path = os.fspath(path)
    fd, st = _open_or_refuse(path)
    name = path if name is None else os.fspath(name)
    try:
        header = None
        if st.st_size > 0:
            where = _where(name)
            header = Header.decode(_pread_header(fd, path), where)
            check_profile(header, profile, where)
            _check_size(header, st.st_size, where)
    except BaseException:
        os.close(fd)
        raise
    return InputCheckpoint(name, profile, fd, st, header)


def load_chunks(path, profile, write_chunk: WriteChunk, transfer=None) -> Loaded:
    """Verify and stream a checkpoint into `write_chunk`; see InputCheckpoint.load_chunks."""
    with open_input(path, profile) as inp:
        return inp.load_chunks(write_chunk, transfer)


def load(path, profile, transfer=None):
    """-> (update_count, P, M, V): the verified planes as float32 views of one payload array."""
    payload = np.empty(profiles.PLANES * profile.parameter_count, "<f4")
    with open_input(path, profile) as inp:
        if transfer is None:
            loaded = inp.load_into(payload.view(np.uint8))
        else:
            raw = payload.view(np.uint8)

            def write_chunk(offset: int, view: np.ndarray) -> None:
                raw[offset:offset + view.size] = view
            loaded = inp.load_chunks(write_chunk, transfer)
    P, M, V = payload.reshape(profiles.PLANES, -1)
    return loaded.update_count, P, M, V


# ------------------------------------------------------------------------------------- lock

@contextlib.contextmanager
def lock(path, name=None):
    """Hold `PATH.lock` of the resolved path (flock LOCK_EX|LOCK_NB) for a run; a second holder is
    refused at once.  Resolving first makes every spelling of one checkpoint (a symbolic link,
    `dir/../`) contend for the same lock file.  The lock dies with its process, so a leftover
    lock file is harmless and is never removed.  `name` is how a refusal calls the checkpoint
    (the user's spelling of a resolved path)."""
    lock_path = os.path.realpath(path) + LOCK_SUFFIX
    fd, _ = paths.open_regular(lock_path, "lock file", CheckpointLocked,
                               {errno.ENOENT: "the checkpoint's directory must exist and be "
                                              "writable",
                                "not regular": "remove it; the run creates its lock file itself"},
                               flags=os.O_RDWR | os.O_CREAT, action="create")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        by = f" (held by pid {holder})" if holder.isdigit() else ""
        raise CheckpointLocked(f"checkpoint {os.fspath(name or path)} is in use by another run: "
                               f"{lock_path} is locked{by}",
                               "wait for that run to finish, or use another checkpoint path"
                               ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock_path
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
