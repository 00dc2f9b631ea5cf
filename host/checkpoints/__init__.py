"""Checkpoint I/O (CONTRACT §10): atomic publication, verified streaming load, the per-path lock.

The streaming cores are `publish_chunks` (host/checkpoints/publication.py) and `load_chunks`
(host/checkpoints/loading.py): payload bytes (P, M, V planes, fp32 LE, concatenated) pass chunk by
chunk through a transfer buffer (the staging window on the cuda backend), so the planes may live
on the device.  `publish`/`load` wrap them for numpy planes.  The envelope's bytes are
host/checkpoints/format.py's; the chunk I/O both directions share is host/checkpoints/chunks.py's.  This
module is where the rest of the host and the tools take every checkpoint name from (the run loop's
publisher calls `publish_chunks` through it), and it holds the per-path lock.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from coppelius.staging import paths

from coppelius.checkpoints.format import CheckpointLocked, CheckpointRefused
from coppelius.checkpoints.loading import (InputCheckpoint, Loaded, load, load_chunks, open_input,
                              read_header)
from coppelius.checkpoints.publication import (TEMP_MARK, CheckpointWriteFailed, Published, publish,
                                 publish_chunks, stale_temporaries)

__all__ = ["CheckpointRefused", "CheckpointLocked", "CheckpointWriteFailed", "Published",
           "Loaded", "InputCheckpoint", "publish_chunks", "publish", "load_chunks", "load",
           "open_input", "read_header", "stale_temporaries", "TEMP_MARK", "lock", "LOCK_SUFFIX"]

LOCK_SUFFIX = ".lock"


@contextlib.contextmanager
def lock(path, name=None):
    """Hold `PATH.lock` of the resolved path (flock LOCK_EX|LOCK_NB) for a run; a second holder is
    refused at once.  Resolving first makes every spelling of one checkpoint (a symbolic link,
    `dir/../`) contend for the same lock file.  The lock dies with its process, so a leftover
    lock file is harmless and is never removed.  `name` is how a refusal calls the checkpoint
    (the user's spelling of a resolved path)."""
    lock_path = os.path.realpath(path) + LOCK_SUFFIX
    # a read-only file system refuses an existing lock file too: say "open", not "create"
    action = "open for writing" if os.path.lexists(lock_path) else "create"
    fd, _ = paths.open_regular(lock_path, "lock file", CheckpointLocked,
                               {errno.ENOENT: "the checkpoint's directory must exist and be "
                                              "writable",
                                "not regular": "remove it; the run creates its lock file itself"},
                               flags=os.O_RDWR | os.O_CREAT, action=action)
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
