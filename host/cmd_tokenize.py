"""`coppelius tokenize SOURCE... -o CACHE`: encode files or directories into a token cache (SPEC §5).

The header carries the sources' newest mtime and total size, taken before any file is read, so a
source edited during or after tokenizing makes the cache stale.  Files are encoded in batches of
about BATCH_BYTES (host.tokenizer.Encoder: each distinct piece once) and streamed to a temporary file
that is renamed over CACHE at the end: an interrupted run never leaves a half cache at CACHE.
"""
from __future__ import annotations

ORDER = 60
BATCH_BYTES = 8 * 1024 * 1024      # text per Encoder.encode call: bounds memory


def register(sub) -> None:
    p = sub.add_parser("tokenize", help="encode text files or directories into a token cache",
                       description="Encode SOURCE files (directories recursively; hidden entries "
                                   "and __pycache__ skipped) with a byte-level BPE tokenizer into "
                                   "a token cache: 16-byte header then u32 ids, "
                                   "<|endoftext|> after every file.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="text files or directories")
    p.add_argument("-o", "--output", required=True, metavar="CACHE", help="token cache to write")
    p.add_argument("--tokenizer", metavar="FILE",
                   help="tokenizers JSON file (default: the shipped stdlib tokenizer)")
    p.add_argument("--profile", default="coppelius",
                   help="profile whose vocabulary bounds the ids (default: coppelius)")
    p.add_argument("--force", action="store_true", help="overwrite an existing CACHE")
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    import pathlib
    import signal
    import tempfile
    import time

    import numpy as np
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    from plan import profiles
    from staging import paths
    from staging import tokens as tk
    from . import tokenizer as tz
    from .errors import UserError

    profile = profiles.get(args.profile)
    tok = tz.load(args.tokenizer)
    ids = tz.vocabulary_size(tok)
    if ids > profile.vocab:
        raise tz.TokenizerRefused(
            f"tokenizer {args.tokenizer or tz.DEFAULT_TOKENIZER} has {ids} ids, more than the "
            f"{profile.name} vocabulary of {profile.vocab}",
            f"train one with at most {profile.vocab} ids (tools/train_tokenizer.py --vocab)")
    eot = tz.end_of_text_id(tok)
    encoder = tz.Encoder(tok)
    out = pathlib.Path(args.output)
    paths.check_output(out, "token cache", overwrite=args.force,
                       exists_hint="pass --force to overwrite it", parents=True)
    files = tk.source_files(args.sources)
    if not files:
        raise UserError(f"no files under {' '.join(args.sources)}", "name files or directories")
    out_resolved = out.resolve()
    if any(f.resolve() == out_resolved for f in files):
        raise UserError(f"{out} is one of the sources", "write the cache outside the sources")
    mtime, size = tk.source_fingerprint(args.sources)      # before reading: edits make it stale

    console = Console(stderr=True)
    n_tokens, latin1 = 0, 0
    t0 = time.perf_counter()
    with paths.refusing("token cache", out, "create"):
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    # SIGTERM unwinds like ^C so the temporary file is removed
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with os.fdopen(fd, "wb") as f, Progress(
                TextColumn("tokenize"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=console, transient=True,
                disable=not console.is_terminal) as bar:
            task = bar.add_task("tokenize", total=size)
            f.write(tk.header_bytes(mtime, size))
            batch, batch_bytes = [], 0

            def flush():
                nonlocal n_tokens
                parts = []
                for ids in encoder.encode(batch):
                    parts.append(ids)
                    if eot is not None:
                        parts.append(np.array([eot], np.uint32))
                arr = np.concatenate(parts).astype("<u4", copy=False)      # (n,)
                f.write(memoryview(arr).cast("B"))
                n_tokens += arr.size
                batch.clear()

            for path in files:
                data = paths.read_regular(path, "source")
                if b"\0" in data:     # binary: BPE over it is slow and useless
                    raise UserError(f"{path} contains NUL bytes: not a text file",
                                    "name only text files, e.g. $(find DIR -name '*.py')")
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text, latin1 = data.decode("latin-1"), latin1 + 1
                batch.append(text)
                batch_bytes += len(data)
                bar.advance(task, len(data))
                if batch_bytes >= BATCH_BYTES:
                    flush()
                    batch_bytes = 0
            if batch:
                flush()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    dt = time.perf_counter() - t0
    contexts = max(0, (n_tokens - 1) // profile.context)
    note = f"; {latin1} file(s) not UTF-8, read as Latin-1" if latin1 else ""
    console.print(f"{out}: {len(files)} file(s), {size:,} bytes -> {n_tokens:,} tokens "
                  f"({size / max(n_tokens, 1):.2f} bytes/token), {contexts:,} contexts of "
                  f"{profile.context}; {dt:.2f} s, {size / 1e6 / max(dt, 1e-9):.1f} MB/s{note}",
                  soft_wrap=True)
    return 0
