"""The tokenizer files of an export: `tokenizer.json` (HF `tokenizers` JSON) and
`tokenizer_config.json`, so `AutoTokenizer.from_pretrained(DIR)` gives the profile's tokenizer.

The tokenizer is the one host/tokenizer.py ships for the profile's vocabulary (`shipped(V)`:
`tokenizer-<V>.json` where one ships, else the default `tokenizer.json`, 12,288 ids, id 0
`<|endoftext|>`).
A profile with fewer ids than the tokenizer found (tiny, V = 512, in a checkout without
`tokenizer-512.json`) gets that tokenizer cut to its ids: a
byte-level BPE's ids are its byte alphabet and then its merges in the order it learned them, so
the first V ids with the merges among them are the BPE that training would have stopped at V.
Either way every id the exported tokenizer emits is one the model has.
"""
from __future__ import annotations

import json

from coppelius import tokenizer as tz

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def _source_json(profile) -> tuple[dict, str]:
    """(the tokenizers JSON as a dict, where it came from) for `profile`."""
    path = tz.shipped(profile.vocab)                    # the profile's own, where one ships
    text = tz.load(path).to_str()                       # refusals (missing, malformed) are load's
    return json.loads(text), str(path)


def _merge_parts(merge) -> tuple[str, str]:
    """A merge as (left, right): tokenizers writes pairs as lists, older files as 'a b'."""
    return tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ", 1))


def cut_to(data: dict, vocab: int) -> dict:
    """The BPE tokenizer `data` with only the ids below `vocab` and the merges that make them."""
    model = dict(data["model"])
    kept = {t: i for t, i in model["vocab"].items() if i < vocab}
    merges = []
    for m in model["merges"]:
        left, right = _merge_parts(m)
        if left in kept and right in kept and left + right in kept:
            merges.append(m)
    model["vocab"], model["merges"] = kept, merges
    out = dict(data)
    out["model"] = model
    out["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < vocab]
    return out


def tokenizer_json(profile) -> tuple[str, dict]:
    """(tokenizer.json's text, a note: source, its ids, the ids kept) for `profile`."""
    data, source = _source_json(profile)
    ids = len(data["model"]["vocab"]) + sum(t["id"] >= len(data["model"]["vocab"])
                                            for t in data.get("added_tokens", []))
    if ids > profile.vocab:
        data = cut_to(data, profile.vocab)
    kept = len(data["model"]["vocab"])
    return json.dumps(data, ensure_ascii=False), {"source": source, "source_ids": ids,
                                                  "ids": kept}


def tokenizer_config(profile) -> dict:
    return {"tokenizer_class": TOKENIZER_CLASS, "model_max_length": profile.context,
            "bos_token": tz.END_OF_TEXT, "eos_token": tz.END_OF_TEXT,
            "pad_token": tz.END_OF_TEXT, "unk_token": None,
            "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False}
