"""The result file's writer (CONTRACT §8–§9): forward part, one step window per observed fence,
then the tail, each reaching the file as the run goes (sections: `coppelius.staging.result_sections`).

A write that fails during a run (ENOSPC, EIO, EDQUOT, EFBIG) is a `ResultWriteError`, an OSError
the run ends on as a host error (exit 4), not a refusal.  So that a full disk still leaves a file
`inspect` reads, the writer reserves, when it is created, the blocks a forward part and a tail need
(fallocate with FALLOC_FL_KEEP_SIZE: the file's size is unchanged, so a killed run's file still
describes itself), past where a completed run's tail goes; a failed write cuts the file back to its
last whole section and punches that reserve out, so the tail fits where the steps stopped.  A
result path that was unlinked or replaced while the run wrote it is caught before the tail goes
to a file nobody can find.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os

import numpy as np

from coppelius.staging import paths
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS

from coppelius.staging.errors import UserError

FORWARD, STEPS, TIMESTAMPS = (RS.SECTION[n] for n in ("forward", "steps", "timestamps"))


class ResultRefused(UserError):
    """The result path cannot be created (exists without overwrite, missing directory, ...)."""


class ResultWriteError(OSError):
    """Writing or syncing the result file failed during a run (disk full, I/O error, the file
    removed or replaced): a host error, not a refusal.  `stage` says what was being written
    ("step 3", "tail"), for the notifier's 40 bytes."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None,
                 stage: str = ""):
        super().__init__(errno, message)
        self.message, self.hint, self.stage = message, hint, stage

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


# fallocate(2) modes: reserve blocks without changing the size; give them back (with KEEP_SIZE)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
RESERVE_SLACK = 4096        # one page: the tail may start inside a partly used one
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)   # a file system without it


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) through libc (os has only posix_fallocate, which changes the size)."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "fallocate", None)
    if call is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if call(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class Reserve:
    """Blocks held for a forward part and a tail of `steps` + 2 issues (and a page of slack),
    just past a completed run's step windows, where its tail goes."""

    def __init__(self, profile, steps: int):
        self.offset = FORWARD.nbytes(profile, 0, 0) + STEPS.nbytes(profile, steps, 0)
        tail = sum(s.nbytes(profile, steps, steps + 2) for s in RS.TAIL)
        self.length = FORWARD.nbytes(profile, 0, 0) + tail + RESERVE_SLACK
        self.held = False

    def take(self, fd: int) -> None:
        """Reserve (a file system without fallocate runs without a reserve)."""
        try:
            _fallocate(fd, FALLOC_FL_KEEP_SIZE, self.offset, self.length)
        except OSError as e:
            if e.errno not in _NO_FALLOCATE:
                raise
            return
        self.held = True

    def release(self, fd: int) -> None:
        """Punch out what is reserved past the file's end, never a byte inside it (an
        overwritten file keeps its old bytes until the first write); best effort: the file's
        bytes are what matters."""
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            start = max(self.offset, st.st_size)
            # to the end of the last reserved block: a partial block is zeroed, not freed
            end = -(-(self.offset + self.length) // st.st_blksize) * st.st_blksize
            if self.held and end > start:
                _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start)
                os.ftruncate(fd, st.st_size)   # ext4 punches only below the size; this frees
        self.held = False


def _path_changed(path, identity) -> str | None:
    """How the path stopped naming the open file ((ino, dev) `identity`), or None."""
    try:
        now = os.stat(path)[1:3]
    except FileNotFoundError:
        return "was removed"
    except OSError:
        return None                         # cannot tell; the writes themselves will say
    return None if now == identity else "was replaced by another file"


def _status_problems(status, steps_written: int, issues: int) -> list[str]:
    """Where the status block disagrees with what the file holds (the reader could not find
    the tail)."""
    fields = R.STATUS_BLOCK.unpack(status)
    problems = []
    if fields["magic"] != R.STATUS_MAGIC:
        problems.append(f"magic {fields['magic']!r} is not {R.STATUS_MAGIC!r}")
    if fields["steps_completed"] != steps_written:
        problems.append(f"steps_completed {fields['steps_completed']} but "
                        f"{steps_written} step windows were written")
    if fields["gp_put"] != issues:
        problems.append(f"gp_put {fields['gp_put']} but the timestamp table has "
                        f"{issues} entries")
    return problems


def _as_bytes(data) -> memoryview:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return memoryview(data).cast("B")


class ResultWriter:
    """Writes a result file as the run goes: forward part, one window per observed fence, tail.

    Each `append_step` reaches the file with one os.write at once, so a killed run's file holds
    every observed step; nothing is fsynced until `close` (file, then directory).
    """

    def __init__(self, fd: int, path: str, profile, created: bool = True):
        self._fd: int | None = fd
        self.path = path
        self.profile = profile
        self.created = created              # this writer made the file (else: --overwrite)
        self._truncate = not created        # an overwritten file is emptied at the first write
        self.forward_written = False
        self.tail_written = False
        self.steps_written = 0
        self.bytes_written = 0
        self.reserve: Reserve | None = None             # blocks held for the tail
        self.failed: ResultWriteError | None = None     # the first write that failed
        self.identity = os.fstat(fd)[1:3]               # (ino, dev): the file this writer owns

    @classmethod
    def create(cls, path, profile, overwrite: bool = False,
               steps: int | None = None) -> "ResultWriter":
        """Create the result file (exclusively), or with `overwrite` open an existing regular
        file, which keeps its bytes until the first write: a run refused before it wrote
        anything leaves a pre-existing file as it was (see `discard`).  Never blocks, never
        writes to a FIFO or device.  With `steps` (a run's), reserve room for the tail: no room
        is a refusal, before anything is written."""
        path = os.fspath(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        created = True
        try:
            try:
                fd = os.open(path, flags | os.O_EXCL, 0o644)
            except FileExistsError:
                if not overwrite:
                    raise ResultRefused(f"result file {path} already exists; refusing to "
                                        "overwrite it", "pass --overwrite to replace it, or "
                                        "choose another --result") from None
                fd, created = os.open(path, flags & ~os.O_CREAT), False
        except OSError as e:
            raise paths.os_refusal(e, "result file", path, "create", ResultRefused,
                                   {errno.ENOENT: "create its directory first, or choose "
                                                  "another --result"}) from None
        paths.regular_fd(fd, "result file", path, ResultRefused,
                         "name a new or regular file with --result")
        writer = cls(fd, path, profile, created)
        if steps is not None:
            writer.reserve = Reserve(profile, steps)
            try:
                writer.reserve.take(fd)
            except OSError as e:
                writer.discard()
                raise ResultRefused(f"result file {path}: cannot reserve "
                                    f"{writer.reserve.length} bytes for its tail: "
                                    f"{paths.errno_text(e)}",
                                    paths.HINTS.get(e.errno, "check the disk")) from None
        return writer

    def discard(self) -> None:
        """Close after a refusal: a file this writer created and never wrote to is removed (so
        the corrected rerun is not refused as "exists"); a file with bytes in it, or one that
        existed before (--overwrite), is kept and synced as `close` does."""
        if self._fd is None:
            return
        if self.bytes_written or not self.created:
            self.close()
            return
        fd, self._fd = self._fd, None
        try:
            mine = os.fstat(fd)
            with contextlib.suppress(OSError):
                now = os.stat(self.path)
                if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                    os.unlink(self.path)    # only the file this writer created, never another
        finally:
            os.close(fd)

    # -- the three parts, in order --
    def write_forward(self, part) -> None:
        self._need_open()
        if self.forward_written:
            raise RuntimeError("result file: the forward part is already written")
        self._write(_exact(part, FORWARD.nbytes(self.profile, 0, 0), FORWARD.label),
                    "forward part")
        self.forward_written = True

    def append_step(self, window) -> None:
        self._need_open()
        if not self.forward_written or self.tail_written:
            raise RuntimeError("result file: a step window goes after the forward part and "
                               "before the tail")
        window = _exact(window, STEPS.unit_bytes(self.profile), "step window")
        self._write(window, f"step {self.steps_written}")
        self.steps_written += 1

    def write_tail(self, stat, loss_block, final_part, semaphores, error_notifier, status,
                   timestamps) -> None:
        """The tail, checked against the steps written so that the reader can find it again."""
        self._need_open()
        if not self.forward_written or self.tail_written:
            raise RuntimeError("result file: the tail goes once, after the forward part")
        given = {"stat": stat, "loss_block": loss_block, "final": final_part,
                 "semaphores": semaphores, "error_notifier": error_notifier, "status": status,
                 "timestamps": timestamps}
        ts = _as_bytes(timestamps)
        entry = TIMESTAMPS.unit_bytes(self.profile)
        if len(ts) % entry:
            raise ValueError(f"result tail: timestamp table of {len(ts)} bytes is not a whole "
                             f"number of {entry}-byte entries")
        issues = len(ts) // entry
        parts = {s.name: _exact(given[s.name], s.nbytes(self.profile, 0, issues), s.label)
                 for s in RS.TAIL}
        problems = _status_problems(parts["status"], self.steps_written, issues)
        if problems:
            raise ValueError("result tail: status block inconsistent with the file: "
                             + "; ".join(problems))
        self.check_path("tail")
        self._write(b"".join(parts.values()), "tail")     # ~66 KB + 64·issues: one write
        self.tail_written = True

    # -- lifetime --
    def close(self) -> None:
        """fsync the file, close it, fsync its directory (so the name survives a crash)."""
        if self._fd is None:
            return
        if self.reserve is not None:
            self.reserve.release(self._fd)
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as e:
            raise ResultWriteError(f"cannot sync result file {self.path}: {paths.errno_text(e)}",
                                   paths.HINTS.get(e.errno, "check the disk"), e.errno,
                                   "sync") from None
        finally:
            os.close(fd)
        paths.fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def _need_open(self) -> None:
        if self._fd is None:
            raise RuntimeError(f"result file {self.path} is closed")

    def check_path(self, stage: str) -> None:
        """The path must still name the file this writer holds open: one unlinked or replaced
        during the run would take the tail where nobody finds it.  Checked before the tail only
        (a stat is ~10 µs of host gap here): step windows written to an orphan harm nothing."""
        what = _path_changed(self.path, self.identity)
        if what is not None:
            self._fail(ResultWriteError(
                f"result file {self.path} {what} while the run wrote it (before the {stage}): "
                f"{paths.errno_text(OSError(errno.ENOENT, os.strerror(errno.ENOENT)))}",
                "leave a run's result file alone until it exits", errno.ENOENT, stage))

    def _fail(self, error: ResultWriteError) -> None:
        """Keep the first failure and raise it."""
        self.failed = self.failed or error
        raise error

    def _write(self, data, stage: str) -> None:
        view = memoryview(data).cast("B")
        start = self.bytes_written
        try:
            if self._truncate:
                os.ftruncate(self._fd, 0)
                self._truncate = False
                if self.reserve is not None:
                    self.reserve.take(self._fd)     # the truncation gave back create's reserve
            while view:
                n = os.pwrite(self._fd, view, self.bytes_written)
                view = view[n:]
                self.bytes_written += n
        except OSError as e:
            self._cut(start)
            self._fail(ResultWriteError(
                f"cannot write result file {self.path} ({stage}): {paths.errno_text(e)}",
                paths.HINTS.get(e.errno, "free space on its file system"), e.errno, stage))

    def _cut(self, size: int) -> None:
        """After a failed write: back to the last whole section, and the reserve given back so
        that the tail fits where the steps stopped."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)
        self.bytes_written = size
        if self.reserve is not None:
            self.reserve.release(self._fd)


def _exact(data, size: int, what: str) -> memoryview:
    view = _as_bytes(data)
    if len(view) != size:
        raise ValueError(f"result file: {what} is {len(view)} bytes, expected {size}")
    return view
