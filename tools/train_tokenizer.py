"""Train a byte-level BPE tokenizer on the .py files of this Python's standard library.

    .venv/bin/python -m tools.train_tokenizer -o FILE [--vocab 12288] [--force]

The output is always named (`-o`, required) and an existing file is refused unless --force: a
training run never replaces a shipped tokenizer by accident.  The shipped ones were made with

    python -m tools.train_tokenizer -o plan/data/tokenizer.json --force               (12,288 ids)
    python -m tools.train_tokenizer -o plan/data/tokenizer-512.json --vocab 512 --force   (tiny)

on CPython 3.11's standard library (the files sorted, so the same Python gives the same bytes).
The same training on your own text, from a checkout or a wheel:
`coppelius tokenize --train-tokenizer FILE --vocab N SOURCE...` (coppelius.tokenizer.train).
Pieces come from coppelius.tokenizer.PIECE_PATTERN (GPT-2's split with ASCII classes), so the
host's cached piecewise encoder reproduces the tokenizer exactly.  Id 0 is `<|endoftext|>` (the
document separator `coppelius tokenize` appends after each file); the 256 byte symbols are always
present, so any text encodes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from coppelius.tokenizer import stdlib_python_files, train
from coppelius.plan import profiles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True,
                    help="tokenizer JSON file to write (refused if it exists, unless --force)")
    ap.add_argument("--vocab", type=int, default=profiles.get("coppelius").vocab)
    ap.add_argument("--force", action="store_true", help="replace an existing OUTPUT")
    args = ap.parse_args(argv)
    if os.path.lexists(args.output) and not args.force:
        print(f"train_tokenizer: {args.output} exists (hint: pass --force to replace it, or "
              "name another -o)", file=sys.stderr)
        return 2
    files = stdlib_python_files()
    size = sum(f.stat().st_size for f in files)
    t = time.perf_counter()
    tok = train(files, args.vocab)
    tok.save(args.output)
    print(f"trained on {len(files)} files, {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f} s; "
          f"{tok.get_vocab_size(with_added_tokens=True)} ids -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
