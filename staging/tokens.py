"""Token caches (CONTRACT §5): open and read with ordinary reads, refuse bad input before device
work, stage contexts, and notice a cache that changes under a running run.

A cache is a 16-byte header (int64 LE source mtime in ns, uint64 LE source size in bytes; both 0
for a generated stream) then uint32 LE ids.  Context c is ids [T·c, T·c + T]: inputs the first T,
targets the last T.  Opening only stats the file and reads its header; `validate_run` scans just
the ids the run will use, in bounded chunks.  Nothing is memory-mapped: a mapping that another
process truncates kills the reader with SIGBUS, with no message and no result tail.  Each step's
context is read again (os.preadv into host memory), after a check that the file still has the
size, mtime and header the run validated, and its ids are checked against V before they reach
staging: a cache that changed under the run raises `TokenCacheChanged`, which ends the run as a
host error (exit 4) before anything from the changed bytes is trained or published.
"""
from __future__ import annotations

import errno
import os
import pathlib
import shlex
import stat
import weakref

import numpy as np

from coppelius.staging import paths
from coppelius.staging import synthetic
from coppelius.staging.errors import UserError

HEADER_BYTES = 16
TOKEN_BYTES = 4
HEADER_DTYPE = np.dtype([("mtime_ns", "<i8"), ("size", "<u8")])
TOKEN_DTYPE = np.dtype("<u4")
NO_TOKENIZER_IDS = 1 << 24             # an id this large is no token: 4 text bytes read as one
_SCAN_TOKENS = 1 << 22                 # 16 MiB of ids per read while validating: bounded buffer
CHANGED_HINT = ("leave a token cache alone while a run reads it (write a new file and rename it "
                "into place); run again to continue from the checkpoint's last publication")


class TokenCacheRefused(UserError):
    """A token cache that cannot feed this run (size, length, id range, stale header)."""


class TokenCacheChanged(Exception):
    """The token cache changed under a running run (size, mtime, header, or an id the run checked
    is now ≥ V): not a refusal — the run has started — but a host error that names the file and
    the context; `reason` is the notifier's short form."""

    def __init__(self, path, context: int, what: str):
        self.path, self.context = path, context
        self.message = (f"token cache {path} changed under the run before context {context} "
                        f"was staged: {what}; nothing trained on the changed bytes")
        self.hint = CHANGED_HINT
        self.reason = f"token cache changed: context {context}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})"


def tokenize_hint(path, profile, force: bool = False) -> str:
    """The command that makes a token cache at `path` for `profile` (SOURCE... stands for the
    user's text files or directories): the profile named, so that its vocabulary is the one the
    cache is made with."""
    force_flag = " --force" if force else ""
    return (f"coppelius tokenize --profile {profile.name} SOURCE... -o "
            f"{shlex.quote(os.fspath(path))}{force_flag}")


def _cache_name_for(text) -> pathlib.Path:
    """A token cache's name beside a text file that is not one: NAME.tokens (NAME-text.tokens
    when the text is already called *.tokens)."""
    text = pathlib.Path(text)
    out = text.with_suffix(".tokens")
    return out if out != text else text.with_name(f"{text.stem}-text.tokens")


def open_hints(path, profile) -> dict:
    return {errno.ENOENT: f"make one from your text: {tokenize_hint(path, profile)}",
            "not regular": f"name a token cache file, made by {tokenize_hint('CACHE', profile)}"}


def _check_embedded(fd: int, path, profile, size: int) -> None:
    """A zero header means the embedded stream: refuse a file that is not that stream, naming a
    file of zeros (a preallocated or zeroed file) as such."""
    want = synthetic.stream_bytes(profile)
    if size == want and synthetic.fd_sha256(fd) == synthetic.expected_sha256(profile):
        return
    if _all_zero(fd, size):
        raise TokenCacheRefused(
            f"token cache {path} is all zeros ({size:,} bytes): a preallocated or zeroed file, "
            f"not a token cache (its zero header would mean the embedded stream, its ids token "
            f"0 alone)", f"make one from your text: {tokenize_hint(path, profile, force=True)}")
    raise TokenCacheRefused(
        f"token cache {path}: its header of zeros marks the {profile.name} embedded stream, but "
        f"its ids are not that stream ({size:,} bytes; the stream is {want:,} bytes of a fixed "
        "sha256)", "leave out --tokens to train on the embedded stream, or make a cache from "
        f"your text: {tokenize_hint(path, profile, force=True)}")


def _all_zero(fd: int, size: int) -> bool:
    """Every byte of the file is zero (read in bounded chunks, stopping at the first other)."""
    chunk = np.empty(min(TOKEN_BYTES * _SCAN_TOKENS, max(size, 1)), np.uint8)   # bounded
    offset = 0
    while offset < size:
        got = os.preadv(fd, [memoryview(chunk)], offset)
        if got == 0:
            break
        if chunk[:got].any():
            return False
        offset += got
    return True


def source_files(sources) -> list[pathlib.Path]:
    """Expand files and directories (recursively, sorted; hidden entries and __pycache__ skipped).
    A named source that cannot be stat'ed, or is neither a regular file nor a directory, is
    refused in one line naming it and the errno."""
    files: list[pathlib.Path] = []
    for src in sources:
        src = pathlib.Path(src)
        st = paths.stat_path(src, "source", TokenCacheRefused)
        if stat.S_ISDIR(st.st_mode):
            for root, dirs, names in os.walk(src):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                files.extend(pathlib.Path(root, n) for n in sorted(names)
                             if not n.startswith(".") and os.path.isfile(os.path.join(root, n)))
        elif stat.S_ISREG(st.st_mode):
            files.append(src)
        else:
            raise paths.not_regular("source", src, st.st_mode, TokenCacheRefused,
                                    "name text files or directories")
    return files


def source_fingerprint(sources) -> tuple[int, int]:
    """(newest mtime in ns, total size in bytes) over the sources' files: the cache header."""
    newest, total = 0, 0
    for f in source_files(sources):
        st = paths.stat_path(f, "source", TokenCacheRefused)
        newest = max(newest, st.st_mtime_ns)
        total += st.st_size
    return newest, total


def header_bytes(mtime_ns: int, size: int) -> bytes:
    return np.array([(mtime_ns, size)], HEADER_DTYPE).tobytes()


def recognize(path) -> str | None:
    """None when the file at `path` is a token cache (`coppelius tokenize --force` may replace
    it): empty, or a 16-byte header and u32 ids every one of which some tokenizer could emit;
    else what it is instead.  Text or other data read as u32 holds ids far beyond any
    tokenizer's (NO_TOKENIZER_IDS), and a checkpoint or a result file does too (its magic, its
    fp32 values)."""
    try:
        fd, st = paths.open_regular(path, "file")
    except UserError as e:
        return e.message
    try:
        size = st.st_size
        if size == 0:
            return None
        if size < HEADER_BYTES or (size - HEADER_BYTES) % TOKEN_BYTES:
            return f"its size {size:,} is not 16 + 4k bytes"
        buf = np.empty(min(_SCAN_TOKENS, (size - HEADER_BYTES) // TOKEN_BYTES), TOKEN_DTYPE)
        first = 0
        while True:
            got = read_ids(fd, first, buf)
            if got == 0:
                return None
            ids = buf[:got]
            if int(ids.max()) >= NO_TOKENIZER_IDS:
                i = int(np.argmax(ids >= NO_TOKENIZER_IDS))
                return (f"token {first + i} would be id {int(ids[i]):,}, beyond any "
                        "tokenizer's ids (text or other data)")
            first += got
    except OSError as e:
        return f"unreadable ({paths.errno_text(e)})"
    finally:
        os.close(fd)


def read_ids(fd: int, first: int, out: np.ndarray) -> int:
    """Read ids [first, first + len(out)) into `out` with ordinary reads; returns how many ids
    arrived (fewer at end of file).  An OSError propagates."""
    view = memoryview(out).cast("B")
    offset, got = HEADER_BYTES + TOKEN_BYTES * first, 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got // TOKEN_BYTES


def _fingerprint(fd: int) -> tuple[int, int, bytes]:
    """(size, mtime ns, header bytes) of the open file: what must not change under a run."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, os.pread(fd, HEADER_BYTES, 0)


class TokenCache:
    """A token cache for one profile, read through its open file descriptor."""

    def __init__(self, path: pathlib.Path, profile, fd: int, fingerprint: tuple[int, int, bytes]):
        self.path = path
        self.profile = profile
        self.fd = fd
        self._close = weakref.finalize(self, os.close, fd)
        self.fingerprint = fingerprint          # (size, mtime ns, header) as opened and checked
        head = np.frombuffer(fingerprint[2], HEADER_DTYPE)[0]
        self.source_mtime_ns = int(head["mtime_ns"])
        self.source_size = int(head["size"])
        self.token_count = (fingerprint[0] - HEADER_BYTES) // TOKEN_BYTES

    @classmethod
    def open(cls, path, profile, stream_checked: bool = False) -> "TokenCache":
        """Open without blocking (a FIFO is refused, not waited on), check the size, read the
        header.  Every OSError is a one-line refusal naming the path and the errno.  A header
        of zeros says "the profile's embedded stream": the file must then be that stream, byte
        for byte (its sha256; `stream_checked` when the caller has just verified it, as
        `synthetic.ensure_default_stream` does), so a zeroed or preallocated file, or ids that
        borrowed the zero header, never train as if they were the stream."""
        path = pathlib.Path(path)
        fd, st = paths.open_regular(path, "token cache", TokenCacheRefused,
                                    open_hints(path, profile))
        try:
            size = st.st_size
            if size < HEADER_BYTES or (size - HEADER_BYTES) % TOKEN_BYTES:
                raise TokenCacheRefused(
                    f"token cache {path}: size {size} is not 16 + 4k bytes "
                    f"({(size - HEADER_BYTES) % TOKEN_BYTES if size >= HEADER_BYTES else size} "
                    f"stray bytes; a 16-byte header then u32 ids)",
                    "the file is truncated or not a token cache; re-run `coppelius tokenize`")
            with paths.refusing("token cache", path, "read", TokenCacheRefused):
                raw = os.pread(fd, HEADER_BYTES, 0)
            if len(raw) < HEADER_BYTES:
                raise TokenCacheRefused(f"token cache {path} shrank while being opened "
                                        f"(fstat said {size} bytes)",
                                        "another process is writing it; retry when it is done")
            if raw == synthetic.STREAM_HEADER and not stream_checked:
                _check_embedded(fd, path, profile, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, profile, fd, (size, st.st_mtime_ns, raw))

    def close(self) -> None:
        self._close()

    # ---- shape ----
    @property
    def context_count(self) -> int:
        """Whole contexts available: context c needs ids up to T·c + T inclusive."""
        return max(0, (self.token_count - 1) // self.profile.context)

    def _where(self, index: int) -> str:
        """'token i (context c input row r, context c-1 target row r')': where an id sits."""
        T = self.profile.context
        parts = []
        c, r = divmod(index, T)
        if c < self.context_count:
            parts.append(f"context {c} input row {r}")
        if index >= 1:
            c, r = divmod(index - 1, T)
            parts.append(f"context {c} target row {r}")
        return f"token {index} ({', '.join(parts)})"

    # ---- validation (CONTRACT §5) ----
    def validate_run(self, c0: int, steps: int, source: str | None = None) -> None:
        """Refuse, naming file and position, anything that would make contexts c0..c0+steps-1 wrong."""
        T, V = self.profile.context, self.profile.vocab
        if source is not None:
            self.check_source(source)
        need = T * (c0 + steps) + 1
        if self.token_count < need:
            raise TokenCacheRefused(
                f"token cache {self.path} has {self.token_count} tokens ({self.context_count} "
                f"contexts); the run uses contexts {c0}..{c0 + steps - 1}, which need "
                f"{T}·({c0}+{steps})+1 = {need} tokens",
                "use a longer stream, fewer steps, or a checkpoint with a smaller update count")
        buf = np.empty(min(_SCAN_TOKENS, need - T * c0), TOKEN_DTYPE)
        for a in range(T * c0, need, _SCAN_TOKENS):
            chunk = buf[:min(need - a, _SCAN_TOKENS)]
            with paths.refusing("token cache", self.path, "read", TokenCacheRefused):
                got = read_ids(self.fd, a, chunk)
            if got < len(chunk):
                raise TokenCacheRefused(f"token cache {self.path} shrank while being checked "
                                        f"(opened with {self.fingerprint[0]} bytes)",
                                        "another process is writing it; retry when it is done")
            if int(chunk.max()) >= V:
                i = int(np.argmax(chunk >= V))
                if int(chunk[i]) >= NO_TOKENIZER_IDS:     # no tokenizer has that many ids
                    raise TokenCacheRefused(
                        f"token cache {self.path}: {self._where(a + i)} has id {int(chunk[i])}, "
                        f"beyond any tokenizer's ids: the file is not a token cache (text?)",
                        "make one from it: " + tokenize_hint(
                            _cache_name_for(self.path), self.profile).replace(
                                "SOURCE...", shlex.quote(os.fspath(self.path))))
                raise TokenCacheRefused(
                    f"token cache {self.path}: {self._where(a + i)} has id {int(chunk[i])}, "
                    f"not below the vocabulary size {V}",
                    f"re-tokenize with the {self.profile.name} profile's tokenizer "
                    f"({V} ids): {tokenize_hint(self.path, self.profile, force=True)}, or use "
                    "the profile the cache was made for")
        with paths.refusing("token cache", self.path, "read", TokenCacheRefused):
            now = _fingerprint(self.fd)
        if now != self.fingerprint:
            raise TokenCacheRefused(f"token cache {self.path} changed while being checked "
                                    f"({_difference(self.fingerprint, now)})",
                                    "another process is writing it; retry when it is done")

    def check_source(self, source) -> None:
        """Refuse when the source's mtime/size no longer match the header (a stale cache)."""
        mtime, size = source_fingerprint([source])
        if (mtime, size) != (self.source_mtime_ns, self.source_size):
            raise TokenCacheRefused(
                f"token cache {self.path} is stale: its header records source mtime "
                f"{self.source_mtime_ns} ns and size {self.source_size} bytes, but {source} now has "
                f"mtime {mtime} ns and size {size} bytes",
                "re-run " + tokenize_hint(self.path, self.profile, force=True).replace(
                    "SOURCE...", shlex.quote(os.fspath(source))))

    def ids(self, first: int = 0, count: int | None = None) -> np.ndarray:
        """Ids [first, first + count) (default: to the end), read now into host memory."""
        count = self.token_count - first if count is None else count
        out = np.empty(count, TOKEN_DTYPE)
        with paths.refusing("token cache", self.path, "read", TokenCacheRefused):
            got = read_ids(self.fd, first, out)
        return out[:got]

    # ---- contexts ----
    def context(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (T,), targets (T,)) of context c, read now into host memory: the file must
        still be what was opened and checked, and every id below V (`TokenCacheChanged`)."""
        if not 0 <= c < self.context_count:
            raise TokenCacheRefused(f"token cache {self.path}: context {c} is outside "
                                    f"0..{self.context_count - 1}", "validate the run first")
        T, V = self.profile.context, self.profile.vocab
        window = np.empty(T + 1, TOKEN_DTYPE)
        try:
            # read, then fingerprint: bytes read while the file changed are never taken for
            # the validated ones (a fingerprint first would miss a change during the read)
            got = read_ids(self.fd, T * c, window)
            now = _fingerprint(self.fd)
        except OSError as e:        # an I/O error reading the cache: a host error naming it
            raise OSError(e.errno, e.strerror, os.fspath(self.path)) from None
        if now != self.fingerprint:
            raise TokenCacheChanged(self.path, c, _difference(self.fingerprint, now))
        if got < T + 1:
            raise TokenCacheChanged(self.path, c, f"it ends at token {T * c + got}")
        if int(window.max()) >= V:
            i = int(np.argmax(window >= V))
            raise TokenCacheChanged(self.path, c, f"{self._where(T * c + i)} now has id "
                                    f"{int(window[i])}, not below the vocabulary size {V}")
        return window[:T], window[1:]

    def write_input_record(self, views, c: int) -> None:
        """Stage context c, checked (`context`): inputs and targets into the staging views (u32,
        aliasing staging); nothing reaches staging when the check fails."""
        inputs, targets = self.context(c)
        views.inputs[:] = inputs
        views.targets[:] = targets


def _difference(was: tuple[int, int, bytes], now: tuple[int, int, bytes]) -> str:
    """'size 8212 → 4016 bytes', 'mtime … → … ns', 'header …': how the file changed."""
    parts = []
    if was[0] != now[0]:
        parts.append(f"size {was[0]} → {now[0]} bytes")
    if was[1] != now[1]:
        parts.append(f"mtime {was[1]} → {now[1]} ns")
    if was[2] != now[2]:
        parts.append(f"header {was[2].hex()} → {now[2].hex()}")
    return ", ".join(parts)
