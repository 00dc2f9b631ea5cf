"""Paths the user names: open them without blocking, and turn every OSError into a refusal.

Every reader of a user-named path (token cache, checkpoint, result file, source, tokenizer) opens
it with `open_regular`: O_NONBLOCK so that a FIFO or a device returns at once instead of waiting
for a writer, then fstat of the *opened* file (no window between a check and the open), a refusal
for anything but a regular file, then O_NONBLOCK cleared.  Every writer checks its output path
with `check_output` before any work, and a writer that must never leave a partial file writes
through `atomic_write`.  An OSError on such a path becomes a `UserError` (or the caller's
subclass) naming what the path is for, the path, and the errno: one line and a hint.

It lives in the lowest layer so that staging and host refuse paths the same way.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import stat
import tempfile

from coppelius.staging.errors import UserError

_OPEN_FLAGS = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

# what to do about an errno, when the caller has nothing more specific
HINTS = {
    errno.ENOENT: "check the path for a typo",
    errno.ENOTDIR: "a component of the path is a file, not a directory; check the path",
    errno.ELOOP: "the path runs through a symbolic-link loop; fix or remove the link",
    errno.ENAMETOOLONG: "a name in the path is longer than the filesystem allows "
                        "(usually 255 bytes); shorten it",
    errno.EACCES: "check the permissions of the path and of its directories",
    errno.EPERM: "check the permissions of the path and of its directories",
    errno.EISDIR: "name a file, not a directory",
    errno.EROFS: "choose a path on a writable filesystem",
    errno.ENOSPC: "free space on the filesystem holding the path",
    errno.EDQUOT: "free space or raise the disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EIO: "the device reports an I/O error; check the disk",
    errno.ENXIO: "the path names a device or FIFO that is not available; name a regular file",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n)",
    errno.ENFILE: "too many open files on the system",
}
DEFAULT_HINT = "check the path"
NEW_FILE_MODE = 0o666         # what open(path, "w") asks for; the umask takes its bits away


def errno_text(e: OSError) -> str:
    """'Not a directory (ENOTDIR)': the errno's meaning and its name."""
    if not e.errno:
        return str(e)
    name = errno.errorcode.get(e.errno)
    text = e.strerror or os.strerror(e.errno)
    return f"{text} ({name})" if name else text


def errno_name(e: BaseException) -> str:
    """'ENOSPC', or the exception's class name when it carries no errno."""
    code = getattr(e, "errno", None)
    return errno.errorcode.get(code, f"errno {code}") if code else type(e).__name__


def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO', ...: what a non-regular file is, for a message."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return kind
    return f"a file of mode {mode:o}"


def os_refusal(e: OSError, what: str, path, action: str = "open", cls=UserError,
               hints: dict | None = None) -> UserError:
    """The refusal for an OSError on `path`: '<what> <path> does not exist' for ENOENT (or 'is a
    symbolic link to a missing file'), else '<what> <path>: cannot <action>: <meaning> (<ENAME>)'."""
    path = os.fspath(path)
    hint = (hints or {}).get(e.errno) or HINTS.get(e.errno, DEFAULT_HINT)
    if e.errno == errno.ENOENT and action in ("open", "read", "stat"):
        with contextlib.suppress(OSError):
            if os.path.islink(path):
                return cls(f"{what} {path} is a symbolic link to a missing file "
                           f"({os.readlink(path)})", "fix or remove the link")
        return cls(f"{what} {path} does not exist", hint)
    return cls(f"{what} {path}: cannot {action}: {errno_text(e)}", hint)


@contextlib.contextmanager
def refusing(what: str, path, action: str, cls=UserError, hints: dict | None = None):
    """Turn an OSError inside the block into the refusal for `path`."""
    try:
        yield
    except OSError as e:
        raise os_refusal(e, what, path, action, cls, hints) from None


def not_regular(what: str, path, mode: int, cls=UserError, hint: str | None = None) -> UserError:
    return cls(f"{what} {os.fspath(path)} is {file_kind(mode)}, not a regular file",
               hint or f"name a {what} file")


def open_regular(path, what: str, cls=UserError, hints: dict | None = None,
                 flags: int = os.O_RDONLY, mode: int = 0o666,
                 action: str = "open") -> tuple[int, os.stat_result]:
    """(fd, fstat) of `path` opened without blocking (`flags` may create it with `mode`; `action`
    is how a refusal names the attempt); anything but a regular file is refused.  `hints` maps
    errnos (and "not regular") to hints that say more than the defaults."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, mode)
    except OSError as e:
        raise os_refusal(e, what, path, action, cls, hints) from None
    return fd, regular_fd(fd, what, path, cls, (hints or {}).get("not regular"))


def regular_fd(fd: int, what: str, path, cls=UserError, hint: str | None = None) -> os.stat_result:
    """fstat of an fd opened with O_NONBLOCK; anything but a regular file is refused (and the fd
    closed), a regular one is switched back to blocking I/O."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(what, path, st.st_mode, cls, hint)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return st


def read_regular(path, what: str, cls=UserError, hints: dict | None = None) -> bytes:
    """The whole content of a regular file, every failure refused."""
    fd, st = open_regular(path, what, cls, hints)
    with refusing(what, path, "read", cls, hints), open(fd, "rb", closefd=True) as f:
        return f.read()


def stat_path(path, what: str, cls=UserError, hints: dict | None = None) -> os.stat_result:
    """os.stat (following links) with every failure refused."""
    try:
        return os.stat(path)
    except OSError as e:
        raise os_refusal(e, what, path, "stat", cls, hints) from None


def check_output(path, what: str, *, overwrite: bool, exists_hint: str | None, cls=UserError,
                 parents: bool = False, recognize=None, foreign_hint: str | None = None,
                 flag: str | None = None) -> None:
    """Refuse, before any work, an output path that cannot become a regular file: one that exists
    (unless `overwrite`) or is not a regular file (a directory, FIFO, device: never replaced),
    a dangling symbolic link, a path through a file, a loop, a name too long, or (unless the
    writer creates `parents`) a missing directory.

    `recognize(path)` says whether an existing file is one this kind of command writes: None
    when it is (a previous output: `overwrite` may replace it), else what it is instead ("a
    checkpoint (magic CPLSCKPT)").  Such a file is refused with or without `overwrite`, naming
    what it is, with `foreign_hint`: no command replaces a file it did not write (a result
    path that names the checkpoint being continued, a plot path that names a token cache);
    `flag` ("--overwrite") is the option such a refusal says cannot help."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise cls(f"{what} {path} is a symbolic link to a missing file "
                      f"({os.readlink(path)})", "remove the link or name another path") from None
        if parents:
            return
        directory = os.path.dirname(os.path.abspath(path))
        try:
            dst = os.stat(directory)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise cls(f"{what} {path}: its directory {directory} does not exist",
                          "create the directory first, or name another path") from None
            raise os_refusal(e, what, path, "create", cls) from None
        if not stat.S_ISDIR(dst.st_mode):
            raise cls(f"{what} {path}: {directory} is {file_kind(dst.st_mode)}, not a directory",
                      HINTS[errno.ENOTDIR])
        return
    except OSError as e:
        raise os_refusal(e, what, path, "create", cls) from None
    if not stat.S_ISREG(st.st_mode):
        raise cls(f"{what} {path} is {file_kind(st.st_mode)}, not a regular file; refusing to "
                  "write to it", "name a new or regular file")
    found = None if recognize is None else recognize(path)
    if found is not None:
        but = f", with or without {flag}" if flag else ""
        raise cls(f"{what} {path} exists and is not a {what}: {found}; refusing to replace "
                  f"it{but}", foreign_hint or "name another path")
    if not overwrite:
        raise cls(f"{what} {path} exists", exists_hint)


def head_bytes(path, limit: int) -> bytes:
    """The first `limit` bytes of a regular file, for a recognizer (b"" when it cannot be read:
    the writer's own open then names the problem)."""
    try:
        fd, _ = open_regular(path, "file")
    except UserError:
        return b""
    try:
        return os.pread(fd, limit, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


NOT_JSON = object()       # json_document's answer for a file that is not UTF-8 JSON


def json_document(path):
    """The parsed content of a JSON file ("" for an empty one; NOT_JSON for anything else: not
    UTF-8, not JSON, unreadable), for a recognizer."""
    try:
        data = read_regular(path, "file")
    except UserError:
        return NOT_JSON
    if not data:
        return ""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return NOT_JSON


def recognize_json(fmt: str):
    """A `check_output` recognizer for the project's versioned JSON files, which name themselves
    with a `"format"` field ("coppelius-digests", "coppelius-telemetry"): an empty file or one of
    format `fmt` is replaceable; anything else is named."""
    def recognize(path) -> str | None:
        doc = json_document(path)
        if doc == "" or (isinstance(doc, dict) and doc.get("format") == fmt):
            return None
        if doc is NOT_JSON:
            return "it is not JSON"
        found = doc.get("format") if isinstance(doc, dict) else None
        if found is None:
            return f'it is JSON without "format": "{fmt}"'
        return f"its format is {found!r}, not {fmt!r}"
    return recognize


def check_directory(path, what: str, cls=UserError) -> None:
    """Refuse, before any work, a directory path that cannot be one: an existing file, FIFO or
    device there is `Not a directory (ENOTDIR)` (as mkdir's EEXIST would misname it), a path
    through a file or a loop its errno; a missing directory is fine (the writer creates it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise os_refusal(e, what, path, "create", cls) from None
    if not stat.S_ISDIR(st.st_mode):
        raise os_refusal(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), what, path,
                         "create", cls, {errno.ENOTDIR: f"{os.fspath(path)} is "
                                         f"{file_kind(st.st_mode)}; name a directory, or a path "
                                         "that does not exist yet"})


def current_umask() -> int:
    """This process's umask (set and restored at once: the only portable way to read it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_directory(directory, strict: bool = False) -> None:
    """Make a rename or create inside `directory` durable.  `strict` (the checkpoint: a
    publication that may not be durable is not published) raises every failure; otherwise a
    directory the OS will not open or fsync (some file systems refuse: EINVAL) is let go, the
    file's own data being synced already."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path, what: str, cls=UserError):
    """A binary file to write `path` through: a temporary beside it (same directory, so the rename
    cannot cross file systems), flushed and fsynced, renamed over `path` when the block ends, then
    the directory fsynced so the name survives a crash.  An exception in the block (^C included)
    removes the temporary and leaves `path` as it was; an OSError creating the temporary is the
    refusal for `path` (`what` names it)."""
    path = pathlib.Path(path)
    with refusing(what, path, "create", cls):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, NEW_FILE_MODE & ~current_umask())    # mkstemp's 0600 is not a new file's
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)
