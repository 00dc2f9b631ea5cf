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
LOCK_ATTEMPTS = 16      # a lock file removed by its holder between our open and our flock: retry


@contextlib.contextmanager
def lock(path, name=None):
    """Hold `PATH.lock` of the resolved path (flock LOCK_EX|LOCK_NB) for a run; a second holder is
    refused at once.  Resolving first makes every spelling of one checkpoint (a symbolic link,
    `dir/../`) contend for the same lock file.  `name` is how a refusal calls the checkpoint
    (the user's spelling of a resolved path).

    The lock file is its holder's: created when the lock is taken, it holds the pid, and it is
    removed (while still locked) when the lock is released, so nothing is left beside the
    checkpoint after a run.  A holder killed with SIGKILL leaves it behind, unlocked: the next
    run takes it and removes it in turn.  A process that opened the file just before its holder
    removed it would lock a file no longer there, so every taker checks after its flock that the
    path still names the file it locked, and opens it again when not."""
    lock_path = os.path.realpath(path) + LOCK_SUFFIX
    for _ in range(LOCK_ATTEMPTS):
        fd = _lock_fd(path, lock_path, name)
        held = os.fstat(fd)
        try:
            now = os.stat(lock_path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)                # its holder removed it: the lock is now a new file's
    else:
        raise CheckpointLocked(f"checkpoint {os.fspath(name or path)}: {lock_path} was removed "
                               f"and created again {LOCK_ATTEMPTS} times while being locked",
                               "another program is removing the lock file; stop it and retry")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock_path
    finally:
        with contextlib.suppress(OSError):
            now = os.stat(lock_path)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                os.unlink(lock_path)            # while locked: no one can hold it meanwhile
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _lock_fd(path, lock_path: str, name) -> int:
    """The lock file opened (created when missing) and flock'ed; CheckpointLocked when another
    process holds it."""
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
    return fd
