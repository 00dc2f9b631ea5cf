"""Train the shipped byte-level BPE tokenizer (V = 12288) on the .py files of Python's stdlib.

    .venv/bin/python -m tools.train_tokenizer [-o plan/data/tokenizer.json] [--vocab 12288]

Pieces come from coppelius.tokenizer.PIECE_PATTERN (GPT-2's split with ASCII classes), so the
host's cached piecewise encoder reproduces the tokenizer exactly.  Id 0 is `<|endoftext|>` (the document separator `coppelius tokenize` appends after each file);
the 256 byte symbols are always present, so any text encodes.
"""
from __future__ import annotations

import argparse
import sys
import time

from coppelius.tokenizer import (DEFAULT_TOKENIZER, END_OF_TEXT, pre_tokenizer, read_text,
                            stdlib_python_files)
from coppelius.plan import profiles


def train(files, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer()        # PIECE_PATTERN split + byte-level mapping
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read_text(f) for f in files), trainer=trainer, length=len(files))
    return tok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(DEFAULT_TOKENIZER))
    ap.add_argument("--vocab", type=int, default=profiles.get("coppelius").vocab)
    args = ap.parse_args(argv)
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
