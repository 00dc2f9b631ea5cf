"""Text to token ids: load the shipped byte-level BPE tokenizer (or a user's), read and encode files.

The tokenizer is HF `tokenizers` JSON; the project ships one per profile vocabulary,
`plan/data/tokenizer.json` (V = 12288 ids) and `plan/data/tokenizer-512.json` (the tiny profile's),
both made by `train` (`tools/train_tokenizer.py`) from Python's standard library; id 0 is
`<|endoftext|>`, which `coppelius tokenize` appends after every file.  `coppelius tokenize
--train-tokenizer FILE` trains one on the user's text.  Files are decoded as
UTF-8; a file that is not valid UTF-8 is read as Latin-1, which maps every byte to one character,
so no input is ever refused or altered silently.  `tokenizers` is imported lazily: `coppelius run`
never needs it.

Speed: the shipped tokenizer splits text into pieces with PIECE_PATTERN (explicit ASCII classes, so
Python's `re` and the tokenizer's Oniguruma split identically), then BPE-encodes each piece alone.
`Encoder` therefore splits with `re` and encodes each *distinct* piece once (the stdlib's 7.1 M
pieces hold 156 k distinct ones), which takes about a fifth of the CPU time per MB of the
tokenizer's own `encode_batch` (figures in docs/PERFORMANCE.md).  A tokenizer with any other
pre-tokenizer, and any text that contains an added token, goes through `encode_batch_fast`.
"""
from __future__ import annotations

import errno
import importlib
import itertools
import json
import pathlib
import re
import sysconfig

import numpy as np

from coppelius.staging import paths

from coppelius.extras import install_command
from coppelius.staging.errors import UserError

# in the data package coppelius.plan.data (no __init__.py): plan/data/ in the checkout,
# coppelius/plan/data/ in a wheel; one tokenizer per vocabulary size (`shipped`)
DATA = pathlib.Path(list(importlib.import_module("coppelius.plan.data").__path__)[0]).resolve()
DEFAULT_TOKENIZER = DATA / "tokenizer.json"         # V = 12288, the coppelius profile's
MIN_FREQUENCY = 2           # a merge must occur at least twice in the training text
END_OF_TEXT = "<|endoftext|>"
_WS = r" \t\n\r\x0b\x0c"
# GPT-2's split with ASCII classes; `_` joins identifiers; other characters are "punctuation"
PIECE_PATTERN = (rf" ?[A-Za-z_]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9_]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+")
_PIECES = re.compile(PIECE_PATTERN)
_CACHE_LIMIT = 2_000_000            # distinct pieces kept; the stdlib needs 156 k


class TokenizerRefused(UserError):
    """A tokenizer file that cannot be used (missing, unreadable, too many ids)."""


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerRefused("the `tokenizers` package is not installed",
                               install_command("text")) from None
    return tokenizers


def recognize(path) -> str | None:
    """None when the file at `path` is a tokenizers JSON file (`--train-tokenizer FILE --force`
    may replace it) or empty; else what it is instead."""
    found = None
    try:
        data = paths.read_regular(path, "file")
        if not data:
            return None
        found = json.loads(data.decode("utf-8"))
    except (UserError, UnicodeDecodeError, ValueError, RecursionError):
        pass
    if isinstance(found, dict) and isinstance(found.get("model"), dict):
        return None
    return "it is no tokenizers JSON file (no \"model\" object)"


def shipped(vocab: int) -> pathlib.Path:
    """The shipped tokenizer for a profile's vocabulary: `tokenizer-<V>.json` where one ships
    (the tiny profile's 512 ids), else the default `tokenizer.json` (12,288 ids)."""
    named = DATA / f"tokenizer-{vocab}.json"
    return named if named.is_file() else DEFAULT_TOKENIZER


def train_hint(vocab: int) -> str:
    """How to make a tokenizer of at most `vocab` ids, as a command that exists in a checkout
    and in a wheel (it never writes a shipped file: the output is named)."""
    return (f"train one on your text: coppelius tokenize --train-tokenizer my-tokenizer.json "
            f"--vocab {vocab} SOURCE..., then pass --tokenizer my-tokenizer.json")


def _default_vocab() -> int:
    from coppelius.plan import profiles
    return profiles.get("coppelius").vocab


def train(files, vocab: int):
    """A byte-level BPE tokenizer of `vocab` ids (id 0 `<|endoftext|>`, the 256 byte symbols
    always present) trained on `files` in the order given: the same files give the same bytes."""
    _tokenizers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer()        # PIECE_PATTERN split + byte-level mapping
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=MIN_FREQUENCY,
                                  show_progress=False, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read_text(f) for f in files), trainer=trainer, length=len(files))
    return tok


def load(path=None, vocab: int | None = None):
    """A `tokenizers.Tokenizer` from a JSON file (default: the shipped one for `vocab` ids, or
    the 12,288-id one).  The file is read without blocking (a FIFO or device is refused) and
    every OSError is a one-line refusal."""
    tk = _tokenizers()
    path = pathlib.Path(path) if path else (shipped(vocab) if vocab else DEFAULT_TOKENIZER)
    data = paths.read_regular(path, "tokenizer", TokenizerRefused,
                              {errno.ENOENT: "omit --tokenizer to use the shipped one",
                               "not regular": "name a tokenizers JSON file"})
    try:
        return tk.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:      # tokenizers raises a bare Exception for malformed JSON
        raise TokenizerRefused(f"tokenizer {path} is not a tokenizers JSON file: "
                               f"{(str(e).splitlines() or [type(e).__name__])[0][:120]}",
                               train_hint(vocab or _default_vocab())) from None


def vocabulary_size(tokenizer) -> int:
    """Every id the tokenizer can emit, added tokens included."""
    return tokenizer.get_vocab_size(with_added_tokens=True)


def end_of_text_id(tokenizer) -> int | None:
    return tokenizer.token_to_id(END_OF_TEXT)


def read_text(path) -> str:
    data = pathlib.Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def stdlib_python_files() -> list[pathlib.Path]:
    """The `.py` files of this Python's standard library (installed packages excluded), sorted."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py")
                  if not skip.intersection(p.relative_to(root).parts) and p.is_file())


def pre_tokenizer():
    """The shipped pre-tokenizer: PIECE_PATTERN split, then byte-level mapping (no regex)."""
    from tokenizers import Regex, pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _piecewise(tokenizer) -> bool:
    """True when encoding each PIECE_PATTERN piece alone gives the tokenizer's own encoding."""
    from tokenizers import Tokenizer, models
    cfg = json.loads(tokenizer.to_str())
    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizer()
    want = json.loads(ref.to_str())["pre_tokenizer"]
    model = cfg.get("model", {})
    return (cfg.get("pre_tokenizer") == want and cfg.get("normalizer") is None
            and cfg.get("post_processor") is None and cfg.get("truncation") is None
            and model.get("type") == "BPE" and model.get("dropout") is None)


def _word_encoder(tokenizer):
    """A copy of `tokenizer` that takes pieces as given: byte-level mapping only, no split.

    Encoding pre-tokenized pieces with it is what the tokenizer does to each piece of a whole text;
    one call for all of a batch's new pieces is single-threaded and, on the stdlib's 156 k distinct
    pieces, 0.9 s of CPU against 1.1–1.7 s for `encode_batch_fast` of each piece alone.
    """
    from tokenizers import Tokenizer, pre_tokenizers
    words = Tokenizer.from_str(tokenizer.to_str())
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return words


class _Numbering(dict):
    """piece -> number; a piece not seen before gets the next number and is queued in `new`.

    Numbering while looking up (one dict pass, the miss handled in Python only once per distinct
    piece) replaces a set union of the batch's pieces and a second lookup pass: 0.54–0.87 s instead
    of 1.02–1.17 s of CPU for the stdlib's 7.1 M pieces.
    """

    def __init__(self):
        super().__init__()
        self.new: list[str] = []

    def __missing__(self, piece: str) -> int:
        self[piece] = number = len(self)
        self.new.append(piece)
        return number


class Encoder:
    """Encode texts to uint32 id arrays, each distinct piece through the tokenizer only once.

    Every distinct piece seen gets a number (`_number`) and a run of ids in one table (`_ids`, the
    run at `_start[k]`, `_count[k]` long).  A text becomes its piece numbers (one dict lookup per
    piece, done in C by `map` into `np.fromiter`), then its ids by one vectorized gather.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = _piecewise(tokenizer)
        self.special = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        self._words = _word_encoder(tokenizer) if self.fast else None
        self._forget()

    def _forget(self) -> None:
        self._number = _Numbering()
        self._ids = np.zeros(0, np.uint32)         # (ids of all distinct pieces,)
        self._start = np.zeros(0, np.int64)        # (distinct pieces,) first id in _ids
        self._count = np.zeros(0, np.int64)        # (distinct pieces,) ids per piece

    def _learn(self) -> None:
        """Encode the pieces numbered since the last call, appending their ids to the table."""
        new = self._number.new
        if not new:
            return
        enc = self._words.encode(new, is_pretokenized=True)
        ids = np.asarray(enc.ids, np.uint32)                                    # (m,)
        count = np.bincount(np.asarray(enc.word_ids, np.int64), minlength=len(new))
        self._start = np.concatenate([self._start, self._ids.size + np.cumsum(count) - count])
        self._count = np.concatenate([self._count, count])
        self._ids = np.concatenate([self._ids, ids])
        self._number.new = []          # only now: an interrupted call leaves them queued

    def _encode_fast(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids of all texts one after the other (n,), where each text's ids end (len(texts),))."""
        if len(self._number) > _CACHE_LIMIT:
            self._forget()
        pieces = [_PIECES.findall(t) for t in texts]
        per_text = np.fromiter(map(len, pieces), np.int64, count=len(texts))    # (texts,)
        n = int(per_text.sum())
        number = np.fromiter(map(self._number.__getitem__, itertools.chain.from_iterable(pieces)),
                             np.int64, count=n)                                 # (n pieces,)
        self._learn()
        count = self._count[number]                                             # (n pieces,)
        end = np.cumsum(count)                                                  # (n pieces,)
        total = int(end[-1]) if n else 0
        # id j of piece p sits at _start[p] + j in the table and at end[p] - count[p] + j here
        ids = self._ids[np.repeat(self._start[number] - (end - count), count) + np.arange(total)]
        text_end = np.concatenate([[0], end])[np.cumsum(per_text)]               # (texts,)
        return ids, text_end

    def _slow(self, text: str) -> bool:
        return not self.fast or any(s in text for s in self.special)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One (n_i,) uint32 array per text."""
        slow = [i for i, t in enumerate(texts) if self._slow(t)]
        out: list[np.ndarray | None] = [None] * len(texts)
        if slow:
            encs = self.tokenizer.encode_batch_fast([texts[i] for i in slow])
            for i, e in zip(slow, encs):
                out[i] = np.asarray(e.ids, np.uint32)
        quick = [i for i in range(len(texts)) if out[i] is None]
        if quick:
            ids, text_end = self._encode_fast([texts[i] for i in quick])
            for i, a in zip(quick, np.split(ids, text_end[:-1])):
                out[i] = a
        return out

    def encode_joined(self, texts: list[str], separator: int | None) -> np.ndarray:
        """All texts' ids in one (n,) uint32 array, `separator` (when not None) after each text."""
        if any(map(self._slow, texts)):
            parts = self.encode(texts)
            if separator is not None:
                sep = np.array([separator], np.uint32)
                parts = [p for a in parts for p in (a, sep)]
            return np.concatenate(parts) if parts else np.zeros(0, np.uint32)
        ids, text_end = self._encode_fast(texts)
        return ids if separator is None else np.insert(ids, text_end, np.uint32(separator))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)
