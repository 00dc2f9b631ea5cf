"""Text to token ids: load the shipped byte-level BPE tokenizer (or a user's), read and encode files.

The tokenizer is HF `tokenizers` JSON; the project ships `plan/data/tokenizer.json`
(made by `tools/train_tokenizer.py` from Python's standard library, V = 12288 ids, id 0 is
`<|endoftext|>`, which `coppelius tokenize` appends after every file).  Files are decoded as
UTF-8; a file that is not valid UTF-8 is read as Latin-1, which maps every byte to one character,
so no input is ever refused or altered silently.  `tokenizers` is imported lazily: `coppelius run`
never needs it.

Speed: the shipped tokenizer splits text into pieces with PIECE_PATTERN (explicit ASCII classes, so
Python's `re` and the tokenizer's Oniguruma split identically), then BPE-encodes each piece alone.
`Encoder` therefore splits with `re` and encodes each *distinct* piece once (the stdlib's 7.1 M
pieces hold 156 k distinct ones), which is what makes tokenizing the stdlib several times faster
than `encode_batch` on this 2-core machine (figures in docs/PERFORMANCE.md).  A tokenizer with any
other pre-tokenizer, and any text that contains an added token, goes through `encode_batch`.
"""
from __future__ import annotations

import errno
import itertools
import json
import pathlib
import re
import sysconfig

import numpy as np

from staging import paths

from .errors import UserError

DEFAULT_TOKENIZER = pathlib.Path(__file__).resolve().parent.parent / "plan" / "data" / "tokenizer.json"
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
                               "pip install 'coppelius[text]' (tokenizers==0.23.3)") from None
    return tokenizers


def load(path=None):
    """A `tokenizers.Tokenizer` from a JSON file (default: the shipped one).  The file is read
    without blocking (a FIFO or device is refused) and every OSError is a one-line refusal."""
    tk = _tokenizers()
    path = pathlib.Path(path) if path else DEFAULT_TOKENIZER
    data = paths.read_regular(path, "tokenizer", TokenizerRefused,
                              {errno.ENOENT: "omit --tokenizer to use the shipped one",
                               "not regular": "name a tokenizers JSON file"})
    try:
        return tk.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:      # tokenizers raises a bare Exception for malformed JSON
        raise TokenizerRefused(f"tokenizer {path} is not a tokenizers JSON file: "
                               f"{(str(e).splitlines() or [type(e).__name__])[0][:120]}",
                               "train one with tools/train_tokenizer.py") from None


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
    return (cfg.get("pre_tokenizer") == want and cfg.get("normalizer") is None
            and cfg.get("post_processor") is None and cfg.get("model", {}).get("type") == "BPE")


class Encoder:
    """Encode texts to uint32 id arrays, each distinct piece through the tokenizer only once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = _piecewise(tokenizer)
        self.special = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        self.cache: dict[str, list[int]] = {}

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        slow = [i for i, t in enumerate(texts)
                if not self.fast or any(s in t for s in self.special)]
        out: list[np.ndarray | None] = [None] * len(texts)
        if slow:
            encs = self.tokenizer.encode_batch_fast([texts[i] for i in slow])
            for i, e in zip(slow, encs):
                out[i] = np.asarray(e.ids, np.uint32)
        quick = [i for i in range(len(texts)) if out[i] is None]
        pieces = [_PIECES.findall(texts[i]) for i in quick]
        if len(self.cache) > _CACHE_LIMIT:
            self.cache.clear()
        new = list(set().union(*pieces).difference(self.cache)) if pieces else []
        if new:
            encs = self.tokenizer.encode_batch_fast(new)
            self.cache.update(zip(new, (e.ids for e in encs)))
        get = self.cache.__getitem__
        for i, ps in zip(quick, pieces):
            out[i] = np.fromiter(itertools.chain.from_iterable(map(get, ps)), np.uint32)
        return out

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)
