"""What `coppelius run` checks before it creates anything, so that a refused run leaves its
directory as it found it: the directory, the checkpoint's path, envelope and lock, the token cache
(the embedded stream verified where it exists, else only its length), the result path.  Then,
once the backend is open, what the embedded default creates: its directory and empty checkpoint.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from coppelius.staging import paths
from coppelius.staging import synthetic
from coppelius.staging.errors import UserError
from coppelius.staging.tokens import TOKEN_BYTES, TokenCache, TokenCacheRefused

from coppelius import checkpoints as ckpt
from coppelius.results import reader as RF
from coppelius.results import telemetry_file


class RunRefused(UserError):
    """A request the run refuses before any device work (paths, steps, backend)."""


def checkpoint_path(req) -> tuple[Path, bool]:
    """(checkpoint path, whether it is the embedded default's and does not exist yet); nothing is
    created: a directory the run will need is only checked (a file there is ENOTDIR)."""
    if req.tokens is None or req.checkpoint is None or req.result is None:
        paths.check_directory(req.directory, "directory", RunRefused)
    if req.checkpoint is not None:
        return Path(req.checkpoint), False
    path = req.directory / f"{req.profile.name}.ckpt"
    return path, not os.path.lexists(path)


def stream_fits(req, c0: int, steps: int) -> None:
    """Refuse, without generating it, a run the embedded stream is too short for (as
    TokenCache.validate_run would: the stream's ids are all below V by construction)."""
    T = req.profile.context
    have = (synthetic.stream_bytes(req.profile) - len(synthetic.STREAM_HEADER)) // TOKEN_BYTES
    need = T * (c0 + steps) + 1
    if have < need:
        path = req.directory / f"{req.profile.name}{synthetic.STREAM_SUFFIX}"
        raise TokenCacheRefused(
            f"embedded stream {path} has {have} tokens ({(have - 1) // T} contexts); the run "
            f"uses contexts {c0}..{c0 + steps - 1}, which need {T}·({c0}+{steps})+1 = {need} "
            "tokens", "use a longer stream, fewer steps, or a checkpoint with a smaller update "
            "count")


def default_stream(req) -> Path | None:
    """The embedded stream's path a run without --tokens trains on (None with --tokens)."""
    if req.tokens is not None:
        return None
    return req.directory / f"{req.profile.name}{synthetic.STREAM_SUFFIX}"


def check_inputs(req, steps: int, c0: int, generate: bool = False):
    """(token cache, result path) for a run from update count `c0`: every refusal of the cache and
    the result path.  The embedded stream is verified where it exists and written only when
    `generate` (a run that will use it); the cache is None when it was not opened."""
    profile = req.profile
    stream = req.directory / f"{profile.name}{synthetic.STREAM_SUFFIX}"
    cache = None
    if req.tokens is not None:
        cache = TokenCache.open(req.tokens, profile)
    elif generate or os.path.lexists(stream):
        cache = TokenCache.open(synthetic.ensure_default_stream(profile, req.directory), profile,
                                stream_checked=True)        # its sha256, just now
    else:
        stream_fits(req, c0, steps)
    try:
        if cache is not None:
            cache.validate_run(c0, steps, source=None if req.source is None else str(req.source))
        result_path = Path(req.result or (req.directory / f"{profile.name}-result-c{c0}.bin"))
        # --overwrite replaces a result file, never another file at that path (the checkpoint
        # being continued, a token cache): what is there is recognized first
        paths.check_output(result_path, "result file", overwrite=req.overwrite, cls=RunRefused,
                           exists_hint="pass --overwrite, or name another --result",
                           parents=req.result is None, recognize=RF.recognize,
                           foreign_hint="name another --result", flag="--overwrite")
        telemetry = telemetry_file.path_for(result_path)
        # its GPU's telemetry goes beside the result file: a regular file there that is not
        # telemetry (the user's) is refused, never replaced; a path the writer cannot use at all
        # (a directory, no permission) stays its warning, as telemetry never fails a run
        if req.backend == "cuda" and telemetry.is_file():
            paths.check_output(telemetry, "telemetry file", overwrite=True, exists_hint=None,
                               cls=RunRefused, parents=req.result is None,
                               recognize=paths.recognize_json(telemetry_file.FORMAT),
                               foreign_hint=f"move {telemetry} away, or name another --result")
    except BaseException:
        if cache is not None:
            cache.close()
        raise
    return cache, result_path


def refuse_locked(ckpt_path: Path) -> None:
    """Refuse now, before anything is created, a checkpoint another run holds (a probe of its lock
    file where one exists; the lock itself is taken later)."""
    lock_path = os.path.realpath(ckpt_path) + ckpt.LOCK_SUFFIX
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return              # none yet (or unreadable): taking the lock names the problem
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        with ckpt.lock(ckpt_path, name=ckpt_path):     # raises CheckpointLocked, held
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def create_defaults(req, ckpt_path: Path, create: bool, created: "Created") -> None:
    """The embedded default's directory and, for a fresh start, its empty checkpoint (a named
    path is never created); what it creates is noted in `created`."""
    if req.tokens is None or req.result is None or create:
        missing = [d for d in (req.directory, *req.directory.parents) if not os.path.lexists(d)]
        with paths.refusing("directory", req.directory, "create", RunRefused):
            req.directory.mkdir(parents=True, exist_ok=True)
        for d in reversed(missing):
            created.add(d, Created.DIRECTORY)
    if create and not os.path.lexists(ckpt_path):
        with paths.refusing("checkpoint", ckpt_path, "create", RunRefused):
            ckpt_path.touch()
        created.add(ckpt_path, Created.EMPTY_FILE)


class Created:
    """What a run created before its first step (directories, the default empty checkpoint, the
    embedded stream), so that a run refused or interrupted before it wrote anything leaves its
    directory as it found it: `undo` removes them, newest first, each only as it was made (a
    directory only when empty, the checkpoint only while it is still empty)."""
    DIRECTORY, EMPTY_FILE, FILE = "directory", "empty file", "file"

    def __init__(self):
        self.made: list[tuple[Path, str]] = []

    def add(self, path: Path, kind: str) -> None:
        self.made.append((Path(path), kind))

    def undo(self) -> None:
        for path, kind in reversed(self.made):
            try:
                if kind == self.DIRECTORY:
                    path.rmdir()                    # ENOTEMPTY: something else is there now
                elif kind == self.FILE or path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
        self.made = []
