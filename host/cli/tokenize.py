"""`coppelius tokenize SOURCE... -o CACHE`: encode sources into a token cache (CONTRACT §5).

The header carries the sources' newest mtime and total size, taken before any file is read, so a
source edited during or after tokenizing makes the cache stale.  Files are cut, in order, into
batches of about BATCH_BYTES; `--jobs` worker processes (default: one per CPU) each read and encode
whole batches (`re` and dict lookups hold the GIL, so threads would not help) and send back one
uint32 array per batch.  The batches are written in source order as they come back, whichever worker
finished first, so the cache is byte-identical for every `--jobs`.  They stream to a temporary file
renamed over CACHE at the end: an interrupted run never leaves a half cache, and no more than the
batches in flight are ever held in memory.
"""
from __future__ import annotations

import dataclasses
import os
import signal

ORDER = 60
# text per batch: 29 batches for the stdlib's 31.5 MB, so two workers finish within a batch of each
# other and the progress bar moves; each worker keeps its own piece cache across its batches
BATCH_BYTES = 1 << 20
MIN_VOCAB = 257            # a trained tokenizer's floor: the 256 byte symbols and <|endoftext|>
START_METHOD = "fork"      # where the OS has it: a worker costs ms, not a fresh interpreter's 0.15 s

_encoder = None            # this process's tz.Encoder: the parent's copy, or a worker's own


def register(sub) -> None:
    import argparse
    p = sub.add_parser("tokenize", help="encode text files or directories into a token cache",
                       description="Encode SOURCE files (directories recursively; hidden entries "
                                   "and __pycache__ skipped) with a byte-level BPE tokenizer into "
                                   "a token cache: 16-byte header then u32 ids, "
                                   "<|endoftext|> after every file.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="text files or directories")
    p.add_argument("-o", "--output", metavar="CACHE", help="token cache to write")
    p.add_argument("--tokenizer", metavar="FILE",
                   help="tokenizers JSON file (default: the shipped stdlib tokenizer of the "
                        "profile's vocabulary: 12,288 ids, or 512 for tiny)")
    p.add_argument("--profile", default="coppelius",
                   help="profile whose vocabulary bounds the ids (default: coppelius)")
    p.add_argument("--train-tokenizer", metavar="FILE",
                   help="instead of a cache: train a byte-level BPE tokenizer on the SOURCEs "
                        "and write it to FILE (for --tokenizer)")
    p.add_argument("--vocab", type=int, metavar="N",
                   help="ids of the tokenizer --train-tokenizer makes (default: the profile's "
                        "vocabulary)")
    p.add_argument("--jobs", "-j", metavar="N",
                   help=f"worker processes (default: the CPU count, here {default_jobs()}); "
                        "the cache is the same for every N")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar with MB/s on stderr (default: only when stderr is a terminal)")
    p.add_argument("--force", action="store_true", help="overwrite an existing CACHE")
    p.set_defaults(func=run)


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_jobs(text: str | None) -> int:
    from coppelius.staging.errors import UserError
    if text is None:
        return default_jobs()
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise UserError(f"--jobs {text}: not a whole number of worker processes ≥ 1",
                        f"omit it for one per CPU ({default_jobs()}), or pass --jobs 1")
    return jobs


def batches(files, limit: int | None = None) -> list[list[str]]:
    """Consecutive runs of files of about `limit` (default BATCH_BYTES) bytes each, by stat size."""
    limit = BATCH_BYTES if limit is None else limit
    out, size = [[]], 0
    for f in files:
        if size >= limit:
            out.append([])
            size = 0
        out[-1].append(str(f))
        size += f.stat().st_size
    return out if out[0] else []


@dataclasses.dataclass
class Batch:
    """What a worker sends back for one batch (a numpy array pickles as one buffer, not a list)."""
    ids: np.ndarray            # (n,) <u4: the batch's files' ids, end of text after each file
    bytes_read: int
    latin1: int                # files that are not UTF-8 and were read as Latin-1
    refused: tuple[str, str] | None = None     # (message, hint) for the first unusable file


def encode_batch(paths: list[str], eot: int | None) -> Batch:
    """Read and encode one batch with this process's encoder; stop at the first unusable file."""
    import numpy as np

    from coppelius.staging.errors import UserError
    from coppelius.staging.paths import read_regular
    texts, bytes_read, latin1 = [], 0, 0
    for path in paths:
        try:            # never blocks (a FIFO is refused), every OSError named with its errno
            data = read_regular(path, "source")
        except UserError as e:
            return Batch(np.zeros(0, "<u4"), bytes_read, latin1, (e.message, e.hint))
        if b"\0" in data:     # binary: BPE over it is slow and useless
            return Batch(np.zeros(0, "<u4"), bytes_read, latin1,
                         (f"{path} contains NUL bytes: not a text file",
                          "name only text files, e.g. $(find DIR -name '*.py')"))
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(data.decode("latin-1"))
            latin1 += 1
        bytes_read += len(data)
    ids = _encoder.encode_joined(texts, eot).astype("<u4", copy=False)
    return Batch(ids, bytes_read, latin1)


def _start_worker(tokenizer_path) -> None:
    """Pool initializer: ^C and SIGTERM are the parent's to handle; load the encoder unless forked
    with the parent's."""
    global _encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _encoder is None:
        from coppelius import tokenizer as tz
        _encoder = tz.Encoder(tz.load(tokenizer_path))


class _Pool:
    """`jobs` worker processes mapping encode_batch over batches in order; 1 job: this process."""

    def __init__(self, jobs: int, tokenizer_path):
        self.pool = None
        if jobs > 1:
            import multiprocessing as mp
            ctx = mp.get_context(START_METHOD if START_METHOD in mp.get_all_start_methods()
                                 else None)
            # one single-threaded worker per core; and a forked child must not use the parent's
            # tokenizers thread pool, whose threads do not survive the fork (the library's own
            # advice; no hang was seen without it, but nothing guarantees that)
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            try:
                self.pool = ctx.Pool(jobs, _start_worker, (tokenizer_path,))
            finally:
                if saved is None:
                    del os.environ["TOKENIZERS_PARALLELISM"]
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved

    def map(self, batch_list, eot):
        if self.pool is None:
            return (encode_batch(b, eot) for b in batch_list)
        return self.pool.imap(_encode_batch_star, [(b, eot) for b in batch_list], chunksize=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _encode_batch_star(args) -> Batch:
    return encode_batch(*args)


def run(args) -> int:
    import pathlib
    import time

    from rich.console import Console

    from coppelius.plan import profiles
    from coppelius.staging import paths
    from coppelius.staging import tokens as tk
    from coppelius import tokenizer as tz
    from coppelius.staging.errors import UserError

    global _encoder
    profile = profiles.get(args.profile)
    if args.train_tokenizer is not None:
        return train_tokenizer(args, profile)
    if args.output is None:
        raise UserError("tokenize needs -o CACHE (or --train-tokenizer FILE)",
                        "name the token cache to write: -o CACHE")
    jobs = parse_jobs(args.jobs)
    tok = tz.load(args.tokenizer, profile.vocab)
    ids = tz.vocabulary_size(tok)
    if ids > profile.vocab:
        raise tz.TokenizerRefused(
            f"tokenizer {args.tokenizer or tz.shipped(profile.vocab)} has {ids} ids, more than "
            f"the {profile.name} vocabulary of {profile.vocab}", tz.train_hint(profile.vocab))
    eot = tz.end_of_text_id(tok)
    out = pathlib.Path(args.output)
    files = tk.source_files(args.sources)
    if not files:
        raise UserError(f"no files under {' '.join(args.sources)}", "name files or directories")
    try:                   # (a cache that does not exist yet cannot be a source)
        out_stat = os.stat(out)
    except OSError:        # check_output names what is wrong with the path
        out_stat = None
    if out_stat is not None and any(os.path.samestat(out_stat, f.stat()) for f in files):
        raise UserError(f"{out} is one of the sources", "write the cache outside the sources")
    # --force replaces a token cache, never another file at that path (text, a checkpoint)
    paths.check_output(out, "token cache", overwrite=args.force,
                       exists_hint="pass --force to overwrite it", parents=True,
                       recognize=tk.recognize, foreign_hint="name another -o CACHE",
                       flag="--force")
    mtime, size = tk.source_fingerprint(args.sources)      # before reading: edits make it stale
    batch_list = batches(files)
    jobs = min(jobs, len(batch_list))

    show = args.progress
    console = Console(stderr=True, force_terminal=True if show else None,
                      emoji=False)      # the cache's path prints as written (markup off below)
    t0 = time.perf_counter()
    with paths.refusing("token cache", out, "create"):
        out.parent.mkdir(parents=True, exist_ok=True)
    _encoder = tz.Encoder(tok)      # forked workers start with this copy
    try:
        n_tokens, latin1 = _write(out, batch_list, jobs, args.tokenizer, eot,
                                  tk.header_bytes(mtime, size), size, console, show)
    finally:
        _encoder = None
    dt = time.perf_counter() - t0
    contexts = max(0, (n_tokens - 1) // profile.context)
    note = f"; {latin1} file(s) not UTF-8, read as Latin-1" if latin1 else ""
    console.print(f"{out}: {len(files)} file(s), {size:,} bytes -> {n_tokens:,} tokens "
                  f"({size / max(n_tokens, 1):.2f} bytes/token), {contexts:,} contexts of "
                  f"{profile.context}; {jobs} job(s), {dt:.2f} s, "
                  f"{size / 1e6 / max(dt, 1e-9):.1f} MB/s{note}",
                  soft_wrap=True, markup=False, highlight=False)
    return 0


def train_tokenizer(args, profile) -> int:
    """`--train-tokenizer FILE`: a tokenizer trained on the sources (coppelius.tokenizer.train),
    written atomically to FILE; a shipped tokenizer is never replaced."""
    import pathlib
    import time

    from coppelius import tokenizer as tz
    from coppelius.staging import paths
    from coppelius.staging import tokens as tk
    from coppelius.staging.errors import UserError
    vocab = profile.vocab if args.vocab is None else args.vocab
    if not MIN_VOCAB <= vocab <= profile.vocab:
        raise UserError(f"--vocab {vocab} is outside {MIN_VOCAB}..{profile.vocab} (the 256 "
                        f"bytes and <|endoftext|> .. the {profile.name} vocabulary)",
                        f"pass --vocab {min(max(vocab, MIN_VOCAB), profile.vocab)}, or another "
                        "--profile")
    out = pathlib.Path(args.train_tokenizer)
    if out.resolve().parent == tz.DATA:
        raise UserError(f"{out} is where the shipped tokenizers live; refusing to replace one",
                        "name a file of your own, e.g. --train-tokenizer my-tokenizer.json")
    paths.check_output(out, "tokenizer", overwrite=args.force,
                       exists_hint="pass --force to overwrite it", recognize=tz.recognize,
                       foreign_hint="name a new file, e.g. --train-tokenizer my-tokenizer.json",
                       flag="--force")
    files = tk.source_files(args.sources)
    if not files:
        raise UserError(f"no files under {' '.join(args.sources)}", "name files or directories")
    t0 = time.perf_counter()
    tok = tz.train(files, vocab)
    with paths.atomic_write(out, "tokenizer") as f:
        f.write(tok.to_str(pretty=True).encode("utf-8"))
    print(f"{out}: {tz.vocabulary_size(tok)} ids trained on {len(files)} file(s) in "
          f"{time.perf_counter() - t0:.1f} s; use it with --tokenizer {out}")
    return 0


def _write(out, batch_list, jobs, tokenizer_path, eot, header, size, console, show):
    """Encode the batches on `jobs` processes into `out`, written atomically (a temporary renamed
    over it at the end: coppelius.staging.paths.atomic_write); (tokens, files read as Latin-1)."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    from coppelius.staging import paths

    from coppelius.staging.errors import UserError
    n_tokens, latin1 = 0, 0
    # the pool forks before the progress bar starts its refresh thread
    with _Pool(jobs, tokenizer_path) as pool:
        # SIGTERM unwinds like ^C so the temporary file is removed
        previous = signal.signal(signal.SIGTERM,
                                 lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            with paths.atomic_write(out, "token cache") as f, Progress(
                    TextColumn("tokenize"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=console, transient=True,
                    disable=not console.is_terminal if show is None else not show) as bar:
                task = bar.add_task("tokenize", total=size)
                f.write(header)
                for batch in pool.map(batch_list, eot):
                    if batch.refused:
                        raise UserError(*batch.refused)
                    f.write(memoryview(batch.ids).cast("B"))
                    n_tokens += batch.ids.size
                    latin1 += batch.latin1
                    bar.advance(task, batch.bytes_read)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return n_tokens, latin1
