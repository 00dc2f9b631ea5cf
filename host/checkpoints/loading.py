"""Checkpoint loading (CONTRACT §10): the envelope reader and the verified streaming load.

The header, identities and sizes are checked before the first chunk is read; every chunk's digest
is checked before the chunk is handed on; the payload is never held twice.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from coppelius.plan import profiles
from coppelius.staging import paths

from coppelius.checkpoints.format import HEADER_BYTES, CheckpointRefused, Header, check_profile
from coppelius.checkpoints.chunks import RING, WriteChunk, aligned, describe, pread_exact, sha256, transfer_view


@dataclass(frozen=True)
class Loaded:
    update_count: int
    payload_sha256: bytes       # SHA-256 of the whole payload (the stat record's field)
    stat: os.stat_result        # fstat of the opened file
    seconds: float
    header: Header


def _plane_label(profile, offset: int) -> str:
    """'P plane, embed' for a payload byte offset."""
    plane_bytes = profile.parameter_count * profiles.BYTES_PER_SCALAR
    plane, element = divmod(offset, plane_bytes)
    element //= profiles.BYTES_PER_SCALAR
    name = next(p.name for p in profile.parameters if p.offset <= element < p.end)
    return f"{'PMV'[plane]} plane, {name}"


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
        where = describe(self.path)
        if self.header is None:
            raise CheckpointRefused(f"{where}: file too short: 0 bytes, a zero-byte file "
                                    "starts fresh and holds no checkpoint",
                                    "a fresh run needs no load")
        h, fd, profile = self.header, self.fd, self.profile
        window = transfer_view(transfer, h.chunk_bytes)
        n = h.chunk_count
        # each slot as large as the largest chunk it holds: a 2-chunk payload never needs more
        # buffer than its own size (a tiny checkpoint: 4 MiB + 1.7 MiB, not 3 × 4 MiB)
        ring = None if landing is not None else \
            [aligned(max(h.chunk_span(i)[1] for i in range(k, n, RING)))
             for k in range(min(RING, n))]

        def buffer(i: int) -> np.ndarray:
            offset, nbytes = h.chunk_span(i)
            if ring is None:                        # load_into: no ring, no copy
                return landing[offset:offset + nbytes]
            return ring[i % RING][:nbytes]

        payload_hash = hashlib.sha256()
        with ThreadPoolExecutor(2, thread_name_prefix="ckpt-load") as pool:
            def read(i: int):
                return pool.submit(pread_exact, fd, buffer(i), HEADER_BYTES + h.chunk_span(i)[0])

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
                chunk_digest = pool.submit(sha256, buf)   # both hashes on their own core
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
        return Header.decode(_pread_header(fd, path), describe(path)), st
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
    """Open a run's checkpoint input (CONTRACT §2): missing → refused; zero bytes → fresh; anything
    else must be an envelope for `profile` (header, identities, sizes checked now).  `name` is
    how later messages call it (the user's spelling of a resolved path)."""
    path = os.fspath(path)
    fd, st = _open_or_refuse(path)
    name = path if name is None else os.fspath(name)
    try:
        header = None
        if st.st_size > 0:
            where = describe(name)
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
