"""Token caches (CONTRACT §5): open by memory map, refuse bad input before device work, stage contexts.

A cache is a 16-byte header (int64 LE source mtime in ns, uint64 LE source size in bytes; both 0
for a generated stream) then uint32 LE ids.  Context c is ids [T·c, T·c + T]: inputs the first T,
targets the last T.  Opening only stats and maps the file (a 400 MB cache opens in well under a
millisecond of reading); `validate_run` scans just the ids the run will use, in vectorized chunks.
"""
from __future__ import annotations

import errno
import os
import pathlib
import stat

import numpy as np

from coppelius.staging import paths
from coppelius.staging.errors import UserError

HEADER_BYTES = 16
TOKEN_BYTES = 4
HEADER_DTYPE = np.dtype([("mtime_ns", "<i8"), ("size", "<u8")])
TOKEN_DTYPE = np.dtype("<u4")
_SCAN_TOKENS = 1 << 22                 # 16 MiB of ids per vectorized max: bounded temporaries


class TokenCacheRefused(UserError):
    """A token cache that cannot feed this run (size, length, id range, stale header)."""


_OPEN_HINTS = {errno.ENOENT: "make one with `coppelius tokenize SOURCE -o CACHE`",
               "not regular": "name a token cache file (`coppelius tokenize SOURCE -o CACHE`)"}


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


class TokenCache:
    """A read-only memory-mapped token cache for one profile."""

    def __init__(self, path: pathlib.Path, profile, tokens: np.ndarray, mtime_ns: int, size: int):
        self.path = path
        self.profile = profile
        self.tokens = tokens                   # (n,) <u4, memory-mapped
        self.source_mtime_ns = mtime_ns
        self.source_size = size

    @classmethod
    def open(cls, path, profile) -> "TokenCache":
        """Open without blocking (a FIFO is refused, not waited on), check the size, map the ids.
        Every OSError is a one-line refusal naming the path and the errno."""
        path = pathlib.Path(path)
        fd, st = paths.open_regular(path, "token cache", TokenCacheRefused, _OPEN_HINTS)
        with open(fd, "rb", closefd=True) as f:
            size = st.st_size
            if size < HEADER_BYTES or (size - HEADER_BYTES) % TOKEN_BYTES:
                raise TokenCacheRefused(
                    f"token cache {path}: size {size} is not 16 + 4k bytes "
                    f"({(size - HEADER_BYTES) % TOKEN_BYTES if size >= HEADER_BYTES else size} "
                    f"stray bytes; a 16-byte header then u32 ids)",
                    "the file is truncated or not a token cache; re-run `coppelius tokenize`")
            n = (size - HEADER_BYTES) // TOKEN_BYTES
            with paths.refusing("token cache", path, "read", TokenCacheRefused):
                raw = os.pread(fd, HEADER_BYTES, 0)
                try:
                    tokens = (np.memmap(f, TOKEN_DTYPE, "r", offset=HEADER_BYTES, shape=(n,))
                              if n else np.zeros(0, TOKEN_DTYPE))
                except ValueError:              # mmap: the file shrank since fstat
                    raw = b""
            if len(raw) < HEADER_BYTES:
                raise TokenCacheRefused(f"token cache {path} shrank while being opened "
                                        f"(fstat said {size} bytes)",
                                        "another process is writing it; retry when it is done")
        head = np.frombuffer(raw, HEADER_DTYPE)[0]
        return cls(path, profile, tokens, int(head["mtime_ns"]), int(head["size"]))

    # ---- shape ----
    @property
    def token_count(self) -> int:
        return int(self.tokens.shape[0])

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
        start = T * c0
        for a in range(start, need, _SCAN_TOKENS):
            chunk = np.asarray(self.tokens[a:min(need, a + _SCAN_TOKENS)])
            if chunk.size and int(chunk.max()) >= V:
                i = int(np.argmax(chunk >= V))
                raise TokenCacheRefused(
                    f"token cache {self.path}: {self._where(a + i)} has id {int(chunk[i])}, "
                    f"not below the vocabulary size {V}",
                    f"re-tokenize with a tokenizer of at most {V} ids "
                    f"(`coppelius tokenize`), or use the profile the cache was made for")

    def check_source(self, source) -> None:
        """Refuse when the source's mtime/size no longer match the header (a stale cache)."""
        mtime, size = source_fingerprint([source])
        if (mtime, size) != (self.source_mtime_ns, self.source_size):
            raise TokenCacheRefused(
                f"token cache {self.path} is stale: its header records source mtime "
                f"{self.source_mtime_ns} ns and size {self.source_size} bytes, but {source} now has "
                f"mtime {mtime} ns and size {size} bytes",
                f"re-run `coppelius tokenize {source} -o {self.path} --force`")

    # ---- contexts ----
    def context(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (T,), targets (T,)) as read-only views of the map."""
        if not 0 <= c < self.context_count:
            raise TokenCacheRefused(f"token cache {self.path}: context {c} is outside "
                                    f"0..{self.context_count - 1}", "validate the run first")
        T = self.profile.context
        window = self.tokens[T * c:T * c + T + 1]
        return window[:T], window[1:]

    def write_input_record(self, views, c: int) -> None:
        """Stage context c: inputs and targets into the staging views (u32, aliasing staging)."""
        inputs, targets = self.context(c)
        views.inputs[:] = inputs
        views.targets[:] = targets
