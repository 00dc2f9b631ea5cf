"""The result file's writer (CONTRACT §8–§9): forward part, one step window per observed fence,
then the tail, each reaching the file as the run goes (sections: `coppelius.staging.result_sections`)."""
from __future__ import annotations

import contextlib
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


class ResultWriteError(UserError):
    """Writing or syncing the result file failed (disk full, I/O error)."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None):
        super().__init__(message, hint)
        self.errno = errno


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

    @classmethod
    def create(cls, path, profile, overwrite: bool = False) -> "ResultWriter":
        """Create the result file (exclusively), or with `overwrite` open an existing regular
        file, which keeps its bytes until the first write: a run refused before it wrote
        anything leaves a pre-existing file as it was (see `discard`).  Never blocks, never
        writes to a FIFO or device."""
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
        return cls(fd, path, profile, created)

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
        self._write(_exact(part, FORWARD.nbytes(self.profile, 0, 0), FORWARD.label))
        self.forward_written = True

    def append_step(self, window) -> None:
        self._need_open()
        if not self.forward_written or self.tail_written:
            raise RuntimeError("result file: a step window goes after the forward part and "
                               "before the tail")
        self._write(_exact(window, STEPS.unit_bytes(self.profile), "step window"))
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
        self._check_status(parts["status"], issues)
        self._write(b"".join(parts.values()))     # ~66 KB + 64·issues: one write
        self.tail_written = True

    def _check_status(self, status, issues: int) -> None:
        """The status block must name what the file holds, or the reader cannot find it."""
        fields = R.STATUS_BLOCK.unpack(status)
        problems = []
        if fields["magic"] != R.STATUS_MAGIC:
            problems.append(f"magic {fields['magic']!r} is not {R.STATUS_MAGIC!r}")
        if fields["steps_completed"] != self.steps_written:
            problems.append(f"steps_completed {fields['steps_completed']} but "
                            f"{self.steps_written} step windows were written")
        if fields["gp_put"] != issues:
            problems.append(f"gp_put {fields['gp_put']} but the timestamp table has "
                            f"{issues} entries")
        if problems:
            raise ValueError("result tail: status block inconsistent with the file: "
                             + "; ".join(problems))

    # -- lifetime --
    def close(self) -> None:
        """fsync the file, close it, fsync its directory (so the name survives a crash)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as e:
            raise ResultWriteError(f"cannot sync result file {self.path}: {paths.errno_text(e)}",
                                   paths.HINTS.get(e.errno, "check the disk"), e.errno) from None
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

    def _write(self, data) -> None:
        view = memoryview(data).cast("B")
        try:
            if self._truncate:
                os.ftruncate(self._fd, 0)
                self._truncate = False
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                self.bytes_written += n
        except OSError as e:
            raise ResultWriteError(f"cannot write result file {self.path}: {paths.errno_text(e)}",
                                   paths.HINTS.get(e.errno, "free space on its file system"),
                                   e.errno) from None


def _exact(data, size: int, what: str) -> memoryview:
    view = _as_bytes(data)
    if len(view) != size:
        raise ValueError(f"result file: {what} is {len(view)} bytes, expected {size}")
    return view
